from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from coding_agent_env.llm import Relay, Upstream
from coding_agent_env.models import Mode
from coding_agent_env.settings import Settings
from tests.fakes.llm import FakeLLM, FakeLLMServer

SERVER_KEY = "sk-server-held-SECRET-0123456789"


@pytest.fixture
def fake() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(FakeLLM(api_key=SERVER_KEY)) as server:
        yield server


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(state_dir=tmp_path / "state", relay_read_timeout_s=5.0)


@pytest.fixture
async def relay(settings: Settings) -> AsyncIterator[Relay]:
    async with Relay(settings) as relay:
        yield relay


def upstream_for(fake: FakeLLMServer, **kw: object) -> Upstream:
    values: dict[str, object] = {"base_url": fake.base_url, "api_key": SecretStr(SERVER_KEY), "model": "Qwen/Qwen3-4B"}
    values.update(kw)
    return Upstream(**values)  # type: ignore[arg-type]


__all__ = ["Mode", "SERVER_KEY", "upstream_for"]
