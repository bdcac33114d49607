from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pydantic import SecretStr

from coding_agent_env.llm import Relay, Upstream
from coding_agent_env.llm.lease import Lease
from coding_agent_env.models import Mode, Turn
from coding_agent_env.settings import LocalConfig, Settings
from tests.fakes.llm import FakeLLM, FakeLLMServer
from tests.helpers import poll

SERVER_KEY = "sk-server-held-SECRET-0123456789"


@pytest.fixture
def fake() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(FakeLLM(api_key=SERVER_KEY)) as server:
        yield server


@pytest.fixture
def settings(state_dir: Path) -> Settings:
    """The suite's settings (a state dir sandbox uids can reach, a uid range of the test's own: see
    tests/conftest.py) with a short relay read timeout."""
    local = LocalConfig(uid_base=300_000 + secrets.randbelow(20_000) * 64, uid_count=64)
    return Settings(state_dir=state_dir, backends=(local,), relay_read_timeout_s=5.0)


@pytest.fixture
async def relay(settings: Settings) -> AsyncIterator[Relay]:
    async with Relay(settings) as relay:
        yield relay


def upstream_for(fake: FakeLLMServer, **kw: object) -> Upstream:
    values: dict[str, object] = {"base_url": fake.base_url, "api_key": SecretStr(SERVER_KEY), "model": "Qwen/Qwen3-4B"}
    values.update(kw)
    return Upstream(**values)  # type: ignore[arg-type]


async def turn_after_hang_up(lease: Lease, url: str, body: dict[str, Any], headers: dict[str, str],
                             enough: bytes) -> Turn:
    """Stream `body` to the relay at `url`, close the connection once the bytes read contain `enough`, and
    return the lease's one turn once the relay has recorded it (it does when its side of the stream ends)."""
    async with aiohttp.ClientSession() as http:
        async with http.post(url, json=body, headers=headers) as response:
            assert response.status == 200, await response.text()
            seen = b""
            async for chunk in response.content.iter_any():
                seen += chunk
                if enough in seen:
                    break
            assert enough in seen
            response.close()
    await poll(lease.turns, "a turn recorded", timeout_s=20, interval_s=0.02)
    [turn] = lease.turns()
    return turn


__all__ = ["Mode", "SERVER_KEY", "turn_after_hang_up", "upstream_for"]


@pytest.fixture(scope="session")
def llama_server() -> Iterator[str]:
    """llama-server on 127.0.0.1 (a free port), one slot, the packaged model, shared by tests/llm's llama.cpp tests;
    killed by its PID at the end. Skips, saying why, until scripts/llama_server.sh has built it."""
    from tests.llm.llamacpp_server import CACHE, built
    from tests.llm.llamacpp_server import llama_server as start_llama_server

    if not built():
        pytest.skip(f"llama-server not built in {CACHE}: run scripts/llama_server.sh (about 17 minutes on 2 cores)")
    with start_llama_server() as url:
        yield url
