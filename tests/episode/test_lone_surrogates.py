"""A lone surrogate (JSON's `"\\ud800"` decodes to one) in a tool argument is a precise argument error of that
call, never an execution error: it names the argument and where the surrogate is, never echoes the value, and
the episode and the session stay usable."""

from __future__ import annotations

import pytest

from coding_agent_env.api.protocols.step import step
from coding_agent_env.api.tools import ROLLOUT, ToolCallFailed
from coding_agent_env.episode import TaskArgumentsError, TerminalArgumentsError, parse_task, parse_terminal
from coding_agent_env.episode.terminal import TerminalCall
from coding_agent_env.session import SessionKind, SessionManager
from coding_agent_env.settings import Settings


@pytest.mark.parametrize(("arguments", "where"), [
    ({"command": "\ud800"}, "command must be valid Unicode text: it holds a lone surrogate (U+D800 at character 0)"),
    ({"command": "echo SECRET \udfff"}, "(U+DFFF at character 12)"),
    ({"command": "", "final_answer": "4\udc80"}, "final_answer must be valid Unicode text"),
])
def test_a_lone_surrogate_in_a_terminal_argument_is_an_argument_error(arguments: dict[str, str], where: str) -> None:
    with pytest.raises(TerminalArgumentsError) as caught:
        parse_terminal(arguments)
    assert where in str(caught.value) and "SECRET" not in str(caught.value)


def test_valid_unicode_beyond_the_bmp_is_a_command() -> None:
    assert parse_terminal({"command": "echo \U0001f600"}) == TerminalCall(command="echo \U0001f600")


@pytest.mark.parametrize("field", ["files", "verify_files"])
def test_a_file_text_no_file_can_hold_is_refused_before_anything_starts(field: str) -> None:
    arguments = {"instruction": "x", field: {"a.txt": "ok", "b.txt": "SECRET\ud800"}}
    with pytest.raises(TaskArgumentsError) as caught:
        parse_task(arguments)
    message = str(caught.value)
    assert f"{field}['b.txt']" in message and "U+D800 at character 6" in message and "SECRET" not in message
    with pytest.raises(ToolCallFailed) as failed:
        ROLLOUT.parse(arguments)
    assert failed.value.error_type == "invalid_args" and "U+D800" in failed.value.message


def test_surrogate_escapes_of_raw_bytes_are_still_file_text() -> None:
    """U+DC80..U+DCFF stand for raw bytes (as `Sandbox.write_text` writes them): a file can hold those."""
    assert parse_task({"instruction": "x", "files": {"a.bin": "\udcff\udc80"}}).files == {"a.bin": "\udcff\udc80"}


async def test_the_step_path_answers_invalid_args_and_the_episode_goes_on(
    settings: Settings, assert_no_leftovers: None
) -> None:
    manager = SessionManager(settings)
    session = manager.create(SessionKind.HTTP)
    try:
        await session.start_episode({"instruction": "x", "sandbox": "local", "command_timeout_s": 20})
        bad = await step(session, {"type": "call_tool", "tool_name": "terminal", "arguments": {"command": "ls \ud800"}})
        error = bad["observation"]["error"]
        assert error["error_type"] == "invalid_args" and "lone surrogate" in error["message"], bad
        good = await step(session, {"type": "call_tool", "tool_name": "terminal", "arguments": {"command": "echo ok"}})
        assert good["observation"]["error"] is None and good["observation"]["result"]["data"]["output"] == "ok\n"
    finally:
        await manager.stop()
