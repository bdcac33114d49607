"""Interception: each real agent's LLM calls reach a trainer loop through the relay and the gate; the
trainer answers them from a script (as a policy would) and the rollout scores 1.0."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from coding_agent_env.gate import Gate
from coding_agent_env.models import RolloutRequest, RolloutStatus
from coding_agent_env.rollout import run_rollout
from coding_agent_env.settings import Settings
from tests.agents.sessions import AGENTS, CORRECT, TASK, VERIFY, session, write_file_command
from tests.fakes.llm import Reply

pytestmark = pytest.mark.usefixtures("assert_no_leftovers")


def completion(reply: Reply) -> dict[str, Any]:
    """A scripted reply as the chat completion a trainer hands the gate."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": args}}
            for i, (name, args) in enumerate(reply.tool_calls)
        ]
    finish = "tool_calls" if reply.tool_calls else "stop"
    return {"choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


async def trainer(gate: Gate, rollout_id: str, script: list[Reply]) -> int:
    """Answer every call of the rollout, in script order (the last reply repeats), until it is unregistered."""
    answered = 0
    async for request in gate.requests(rollout_id):
        await gate.deliver(request, completion(script[min(answered, len(script) - 1)]))
        answered += 1
    return answered


@pytest.mark.parametrize("agent", AGENTS)
async def test_rollout_through_the_gate(agent: str, settings: Settings, require_agent: Callable[[str], None]) -> None:
    require_agent(agent)
    async with Gate(settings) as gate:
        registered = await gate.register()
        answering = asyncio.ensure_future(
            trainer(gate, registered.rollout_id, session(agent, write_file_command("binary_search.py", CORRECT)))
        )
        request = RolloutRequest(instruction=TASK, agent=agent, base_url=registered.base_url,
                                 api_key=registered.token, model="policy", verify=VERIFY, agent_timeout_s=120)
        try:
            result = await run_rollout(request, settings=settings)
        finally:
            await gate.unregister(registered.rollout_id)
        answered = await answering
    assert result.status is RolloutStatus.COMPLETED, (result.error, result.agent_log_tail)
    assert result.reward == 1.0 and answered == len(result.proxy_turns) >= 2
