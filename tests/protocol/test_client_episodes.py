"""The client's episode path (`CodingAgentEnv.reset` with a task, `terminal`, `keystrokes`, `final_answer`,
`step`, `list_tools`), async and sync, typed, against a live server on the local bubblewrap backend."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from coding_agent_env.client import (
    CodingAgentEnv,
    EpisodeReport,
    EpisodeStart,
    ServerError,
    StepReply,
    TerminalResult,
    ToolCallError,
)
from coding_agent_env.episode import EpisodeStatus

HELLO = {"instruction": "Create hello.txt containing hi.", "verify": ["grep -qx hi hello.txt"]}

pytestmark = pytest.mark.usefixtures("assert_no_leftovers")


@pytest.fixture
def url(make_live: Callable[..., Any]) -> str:
    return make_live(enable_web_interface=False).http


def test_sync_episode_is_typed_from_reset_to_reward(url: str) -> None:
    with CodingAgentEnv(url).sync() as env:
        start = env.reset(episode_id="ep-1", **HELLO)
        assert isinstance(start, EpisodeStart) and not start.done
        assert start.instruction == HELLO["instruction"] and start.text and "Setup: none." in start.text
        assert start.episode is not None and start.episode.status is EpisodeStatus.RUNNING
        assert start.episode.episode_id == "ep-1"
        assert {"terminal", "keystrokes"} <= {tool["name"] for tool in start.tools}

        env.terminal("cd /tmp && export WORD=hi")
        out = env.terminal("echo $WORD; pwd")  # the shell kept its directory and variable
        assert isinstance(out, TerminalResult)
        assert (out.output, out.exit_code, out.timed_out) == ("hi\n/tmp\n", 0, False)
        assert env.terminal("cd - >/dev/null && echo $WORD > hello.txt").exit_code == 0

        report = env.final_answer("done")
        assert isinstance(report, EpisodeReport)
        assert (report.status, report.reward, report.done) == (EpisodeStatus.COMPLETED, 1.0, True)
        assert [result.exit_code for result in report.verify_results] == [0]
        with pytest.raises(ToolCallError) as ended:
            env.terminal("ls")
        assert ended.value.error_type == "execution_error" and "has ended" in str(ended.value)
        state = env.state()
        assert (state.episode_id, state.last_reward, state.last_status) == ("ep-1", 1.0, "completed")


async def test_async_episode_keystrokes_timeouts_and_a_wrong_answer(url: str) -> None:
    async with CodingAgentEnv(url) as env:
        await env.reset(instruction="Write 42 to answer.txt.", verify=["grep -qx 42 answer.txt"],
                        command_timeout_s=1)
        typed = await env.keystrokes("echo typed\n", duration=0.5)
        assert "typed" in typed.output and typed.exit_code is None
        slow = await env.terminal("sleep 30")
        assert slow.timed_out and slow.exit_code is None and slow.note
        assert (await env.terminal("echo 41 > answer.txt")).exit_code == 0
        report = await env.final_answer()
        assert (report.status, report.reward, report.done) == (EpisodeStatus.COMPLETED, 0.0, True)


async def test_failed_setup_ends_the_episode_at_reset(url: str) -> None:
    async with CodingAgentEnv(url) as env:
        start = await env.reset(instruction="x", setup=["exit 3"], verify=["true"])
        assert start.done and start.episode is not None
        assert start.episode.status is EpisodeStatus.SETUP_FAILED and start.episode.reward is None
        assert [result.exit_code for result in start.episode.setup_results] == [3]
        with pytest.raises(ToolCallError):
            await env.final_answer()


async def test_refusals_are_typed_and_leave_the_session_usable(url: str) -> None:
    async with CodingAgentEnv(url) as env:
        with pytest.raises(ServerError) as refused:
            await env.reset(instruction="x", files={"/etc/passwd": "no"})
        assert refused.value.code == "EXECUTION_ERROR"
        await env.reset(**HELLO)
        with pytest.raises(ToolCallError) as bad:
            await env.terminal("")
        assert bad.value.error_type == "invalid_args"
        assert (await env.terminal("true")).exit_code == 0


async def test_raw_step_and_list_tools(url: str) -> None:
    async with CodingAgentEnv(url) as env:
        assert [tool["name"] for tool in await env.list_tools()] == ["run_rollout"]
        start = await env.reset(**HELLO)
        assert start.episode is not None
        assert {"terminal", "keystrokes"} <= {tool["name"] for tool in await env.list_tools()}
        reply = await env.step({"type": "call_tool", "tool_name": "terminal",
                                "arguments": {"command": "echo hi > hello.txt", "final_answer": ""}})
        assert isinstance(reply, StepReply) and (reply.reward, reply.done) == (None, False)
        assert reply.observation["result"]["data"]["exit_code"] == 0
        reply = await env.step({"type": "call_tool", "tool_name": "terminal", "arguments": {"final_answer": "x"}})
        assert (reply.reward, reply.done) == (1.0, True)
        bare = await env.reset()
        assert bare == EpisodeStart()
