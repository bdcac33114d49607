"""The typed client, async and sync, against a live server."""

from __future__ import annotations

from typing import Any

import pytest

from coding_agent_env.client import CodingAgentEnv, ServerError, ToolCallError, ws_url
from coding_agent_env.models import RolloutRequest, RolloutStatus
from tests.protocol.live import LiveServer


def test_ws_url() -> None:
    assert ws_url("http://h:1/") == "ws://h:1/ws"
    assert ws_url("https://h/p") == "wss://h/p/ws"
    assert ws_url("h:8000") == "ws://h:8000/ws"


async def test_async_client(server: LiveServer, oracle_task: dict[str, Any]) -> None:
    async with CodingAgentEnv(server.http) as env:
        await env.reset(episode_id="c-1")
        result = await env.run_rollout(**oracle_task)
        assert result.status is RolloutStatus.COMPLETED and result.reward == 1.0
        state = await env.state()
        assert (state.episode_id, state.step_count, state.rollouts_completed) == ("c-1", 1, 1)
        assert state.last_status == "completed" and state.last_reward == 1.0
        with pytest.raises(ToolCallError) as failed:
            await env.run_rollout(instruction="x", agent="nop", sandbox="nowhere")
        assert failed.value.error_type == "execution_error"


def test_sync_client(server: LiveServer, oracle_task: dict[str, Any]) -> None:
    request = RolloutRequest.model_validate(oracle_task)
    with CodingAgentEnv(server.http).sync() as env:
        env.reset()
        assert env.run_rollout(request).reward == 1.0
        assert env.state().rollouts_completed == 1


def test_reply_timeout_follows_the_request_deadline() -> None:
    env = CodingAgentEnv("http://127.0.0.1:1", reply_margin_s=0)
    short = RolloutRequest(instruction="x", agent="nop", agent_timeout_s=10)
    long = RolloutRequest(instruction="x", agent="nop", agent_timeout_s=1000, verify=["true"] * 3)
    assert env.deadline_for(long) - env.deadline_for(short) == pytest.approx(990 + 3 * 120)


async def test_capacity_error_is_typed(make_server: Any) -> None:
    server = make_server(max_concurrent_envs=1)
    async with CodingAgentEnv(server.http) as first:
        await first.state()
        with pytest.raises(ServerError) as refused:
            async with CodingAgentEnv(server.http) as second:
                await second.state()
        assert refused.value.code == "CAPACITY_REACHED"
