"""Bad input to an episode: each a precise error of that call, never echoing values."""

from __future__ import annotations

import pytest

from coding_agent_env.episode import TaskArgumentsError, TerminalArgumentsError, is_task, parse_task, parse_terminal
from coding_agent_env.episode.task import AGENT_RUN_FIELDS, TASK_FIELDS, task_schema
from coding_agent_env.episode.terminal import TerminalCall
from coding_agent_env.models import RolloutRequest, Task
from coding_agent_env.settings import WireLimits


def test_upstream_names_are_accepted_and_blanks_dropped() -> None:
    task = parse_task({"instruction": "x", "setup_scripts": "echo a", "verify_scripts": ["", "true", "  "],
                       "sandbox_backend": "local"})
    assert (task.setup, task.verify, task.sandbox, task.agent) == (["echo a"], ["true"], "local", "nop")
    assert parse_task({"instruction": "x", "setup_scripts": ""}).setup == []


def test_a_bare_reset_is_not_a_task() -> None:
    assert not is_task({}) and not is_task({"seed": 1, "episode_id": "e"})
    assert is_task({"instruction": "x"}) and is_task({"setup_scripts": "x"})


@pytest.mark.parametrize(("arguments", "message"), [
    ({"setup_scripts": "x"}, "instruction: Field required"),
    ({"instruction": "x", "setup": ["a"], "setup_scripts": "b"}, "either setup or setup_scripts"),
    ({"instruction": "x", "setup_scripts": 3}, "setup_scripts must be a string or a list of strings"),
    ({"instruction": "x", "verify_scripts": ["ok", 1]}, "verify_scripts must be a string or a list"),
    ({"instruction": "x", "agent": "opencode"}, "unknown task field(s): agent"),
    ({"instruction": "x", "api_key": "sk-SECRET-VALUE"}, "unknown task field(s): api_key"),
    ({"instruction": "x", "files": {"../up": "x"}}, "contains '..'"),
    ({"instruction": "x", "command_timeout_s": "soon"}, "command_timeout_s"),
    ({"instruction": "x", "limits": {"memory_mb": "lots"}}, "limits.memory_mb"),
    ({"instruction": "x", "setup": ["a\x00b"]}, "NUL"),
])
def test_bad_task_arguments(arguments: dict[str, object], message: str) -> None:
    with pytest.raises(TaskArgumentsError) as caught:
        parse_task(arguments)
    assert message in str(caught.value)
    assert "SECRET" not in str(caught.value)


def test_terminal_arguments_as_upstream_sends_them() -> None:
    assert parse_terminal({"command": "ls", "final_answer": ""}) == TerminalCall(command="ls")
    assert parse_terminal({"command": "", "final_answer": "42"}) == TerminalCall(final_answer="42")
    assert parse_terminal({"command": None, "final_answer": "42"}) == TerminalCall(final_answer="42")
    assert parse_terminal({"command": "echo"}) == TerminalCall(command="echo")


@pytest.mark.parametrize(("arguments", "message"), [
    ("ls", "must be an object"),
    ({"command": "ls", "final_answer": "42"}, "not both"),
    ({"command": "", "final_answer": ""}, "both are empty"),
    ({"command": "  "}, "both are empty"),
    ({}, "both are empty"),
    ({"command": ["ls"]}, "command must be a string, not list"),
    ({"command": 3}, "command must be a string, not int"),
    ({"command": "a\x00b"}, "NUL"),
    ({"final_answer": "a\x00b"}, "NUL"),
    ({"command": "x" * (WireLimits.MAX_COMMAND_BYTES + 1)}, "longer than"),
    ({"final_answer": "x" * (WireLimits.MAX_FINAL_ANSWER_BYTES + 1)}, "longer than"),
    ({"command": "ls", "cwd": "/"}, "unknown terminal argument(s): cwd"),
])
def test_bad_terminal_arguments(arguments: object, message: str) -> None:
    with pytest.raises(TerminalArgumentsError) as caught:
        parse_terminal(arguments)
    assert message in str(caught.value)


def test_every_task_field_but_the_agent_runs_is_an_episode_field() -> None:
    """`reset` takes what `models.Task` declares: a new task field reaches episodes without a second list."""
    assert AGENT_RUN_FIELDS == {"solution", "solution_files", "solution_env", "agent_timeout_s", "steps", "step_reward"}
    assert TASK_FIELDS == set(Task.model_fields) - AGENT_RUN_FIELDS
    assert set(Task.model_fields) < set(RolloutRequest.model_fields)
    assert TASK_FIELDS <= set(task_schema()["properties"])
    task = parse_task({"instruction": "x", "verify_files_root": "/tests", "reward_file_required": True})
    assert (task.verify_files_root, task.reward_file_required) == ("/tests", True)
    for agent_run_field in ({"solution": ["true"]}, {"agent_timeout_s": 5}, {"solution_files": {"a": "b"}},
                            {"steps": [{"name": "a", "instruction": "b"}]}):
        with pytest.raises(TaskArgumentsError, match="unknown task field"):
            parse_task({"instruction": "x", **agent_run_field})
