"""`llm.access`: one rollout's way into the LLM path. It leases, tells the sandbox and the agent how to reach
the relay (never the upstream key), revokes early on request, and always revokes on exit, even when the body
fails or is cancelled, keeping the turns."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

import coding_agent_env.llm.forwarder as forwarder_module
from coding_agent_env.errors import RelayError
from coding_agent_env.llm import Relay, RolloutLlm, SharedRelay, access
from coding_agent_env.settings import Settings
from tests.fakes.llm import FakeLLMServer, Reply
from tests.helpers import poll
from tests.llm.conftest import SERVER_KEY, upstream_for

MESSAGES = [{"role": "user", "content": "hi"}]
TTL_S = 60.0


async def call(llm: RolloutLlm) -> int:
    """One chat call to the relay's loopback listener with the rollout's token; the HTTP status."""
    given = llm.for_agent(llm.sandbox_relay.tcp_url if llm.sandbox_relay is not None else None)
    headers = {"Authorization": f"Bearer {given.token}"}
    async with aiohttp.ClientSession() as http:
        async with http.post(given.base_url + "/chat/completions", json={"messages": MESSAGES}, headers=headers) as r:
            return r.status


async def test_the_sandbox_and_the_agent_get_the_relay_and_a_token_never_the_key(
    relay: Relay, fake: FakeLLMServer, settings: Settings
) -> None:
    upstream = upstream_for(fake)
    async with access(relay, "r", upstream, settings=settings, ttl_s=TTL_S, from_sandbox=True) as llm:
        endpoint = llm.sandbox_relay
        assert endpoint is not None and endpoint.socket_path == str(relay.socket_path)
        assert endpoint.tcp_url == relay.base_url and endpoint.serve is not None
        forwarder = Path(endpoint.forwarder_path)
        assert forwarder.read_bytes() == Path(forwarder_module.__file__).read_bytes()
        assert forwarder.stat().st_mode & 0o777 == 0o644  # readable by sandbox uids
        given = llm.for_agent("http://127.0.0.1:8765/v1")
        assert given.base_url == "http://127.0.0.1:8765/v1" and given.model == "Qwen/Qwen3-4B"
        assert given.token.startswith("car-") and SERVER_KEY not in repr(given)
        assert set(llm.secrets) == {SERVER_KEY, given.token}
        with pytest.raises(RelayError, match="no relay URL"):
            llm.for_agent(None)
    async with access(relay, "t", upstream, settings=settings, ttl_s=TTL_S, from_sandbox=False) as in_server:
        assert in_server.sandbox_relay is None  # its sandbox needs no network
        assert in_server.for_agent("http://ignored/v1").base_url == relay.base_url


async def test_revoke_ends_the_token_at_once_and_keeps_the_turns(
    relay: Relay, fake: FakeLLMServer, settings: Settings
) -> None:
    fake.app.script = [Reply(content="one")]
    async with access(relay, "r", upstream_for(fake), settings=settings, ttl_s=TTL_S, from_sandbox=False) as llm:
        assert await call(llm) == 200
        await llm.revoke()
        assert await call(llm) == 401
        await llm.revoke()  # idempotent
        assert [turn.message.content for turn in llm.turns()] == ["one"]
    assert [turn.message.content for turn in llm.turns()] == ["one"] and len(fake.app.requests) == 1


async def test_exit_revokes_when_the_body_fails(relay: Relay, fake: FakeLLMServer, settings: Settings) -> None:
    """As when the sandbox's close fails during teardown: the token still dies and the turns stay."""
    kept: list[RolloutLlm] = []
    with pytest.raises(OSError, match="close failed"):
        async with access(relay, "r", upstream_for(fake), settings=settings, ttl_s=TTL_S, from_sandbox=False) as llm:
            kept.append(llm)
            assert await call(llm) == 200
            raise OSError("close failed")
    assert await call(kept[0]) == 401 and len(kept[0].turns()) == 1


async def test_exit_revokes_when_cancelled_with_a_call_in_flight(
    relay: Relay, fake: FakeLLMServer, settings: Settings
) -> None:
    fake.app.script = [Reply(hang=True)]
    kept: list[RolloutLlm] = []

    async def rollout() -> None:
        async with access(relay, "r", upstream_for(fake), settings=settings, ttl_s=TTL_S, from_sandbox=False) as llm:
            kept.append(llm)
            await call(llm)

    task = asyncio.ensure_future(rollout())
    await poll(lambda: len(fake.app.requests) == 1)  # the call reached the upstream, which never answers
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    [turn] = kept[0].turns()
    assert turn.error is not None  # the cut call is recorded
    assert await call(kept[0]) == 401


async def test_without_a_relay_a_private_one_lives_for_the_context(fake: FakeLLMServer, settings: Settings) -> None:
    async with access(None, "r", upstream_for(fake), settings=settings, ttl_s=TTL_S, from_sandbox=True) as llm:
        endpoint = llm.sandbox_relay
        assert endpoint is not None and Path(endpoint.socket_path).exists()
        assert await call(llm) == 200
    assert not Path(endpoint.socket_path).exists()  # stopped with the rollout
    with pytest.raises(aiohttp.ClientConnectionError):
        await call(llm)


async def test_a_shared_relay_starts_on_first_use_and_outlives_the_rollout(
    fake: FakeLLMServer, settings: Settings
) -> None:
    shared = SharedRelay(settings)
    try:
        async with access(shared, "r", upstream_for(fake), settings=settings, ttl_s=TTL_S, from_sandbox=False) as llm:
            assert await call(llm) == 200
        relay = await shared.get()
        assert llm.for_agent(None).base_url == relay.base_url and relay.state.value == "running"
    finally:
        await shared.stop()
