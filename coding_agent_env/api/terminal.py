"""The `terminal` tool of an interactive episode, as every path presents it (beside `run_rollout`).

It is offered while the session's episode lives. A command's result is a `TerminalResult`; a final answer's
is the episode's `EpisodeReport` (with its reward, `done`). The tool-result dict is OpenEnv's, as for
`run_rollout`: `data` holds the result, `content[0].text` states it for clients that read only text (the
command's output and exit code; for a final answer the outcome: passed/total and the reward, as upstream's
terminus_env says it).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from coding_agent_env.api.tool import TOOL_NAME, ToolCallFailed, tool_descriptor
from coding_agent_env.episode import Episode, EpisodeError, EpisodeReport, TerminalArgumentsError, TerminalResult
from coding_agent_env.episode.terminal import TERMINAL_DESCRIPTION, TERMINAL_SCHEMA, TERMINAL_TOOL
from coding_agent_env.session import Session

__all__ = [
    "TERMINAL_TOOL",
    "TerminalOutcome",
    "command_text",
    "episode_observation",
    "is_known_tool",
    "run_terminal",
    "session_tools",
    "start_text",
    "terminal_descriptor",
    "tool_list",
]


@dataclass(frozen=True)
class TerminalOutcome:
    """A `terminal` call's tool-result dict, and for a final answer the episode's reward and end."""

    result: dict[str, Any]
    reward: float | None = None
    done: bool = False


@functools.cache
def terminal_descriptor(schema_key: str) -> dict[str, Any]:
    """`{name, description, <schema_key>}` of `terminal`; callers must not mutate it."""
    return {"name": TERMINAL_TOOL, "description": TERMINAL_DESCRIPTION, schema_key: TERMINAL_SCHEMA}


def session_tools(session: Session | None, schema_key: str) -> list[dict[str, Any]]:
    """The tools a session offers: `run_rollout`, and `terminal` while its episode lives."""
    return tool_list(schema_key, terminal=session is not None and session.live_episode is not None)


def tool_list(schema_key: str, *, terminal: bool) -> list[dict[str, Any]]:
    """`run_rollout`'s descriptor, and `terminal`'s too with `terminal`."""
    return [tool_descriptor(schema_key), *([terminal_descriptor(schema_key)] if terminal else [])]


def is_known_tool(name: str) -> bool:
    return name in (TOOL_NAME, TERMINAL_TOOL)


async def run_terminal(session: Session, arguments: Any) -> TerminalOutcome:
    """One `terminal` call in `session`'s episode. `ToolCallFailed` for a call that did not run (bad
    arguments: `invalid_args`; no episode, busy, ended: `execution_error`); `SessionClosedError` passes."""
    try:
        outcome = await session.terminal(arguments)
    except TerminalArgumentsError as exc:
        raise ToolCallFailed("invalid_args", f"Error calling tool '{TERMINAL_TOOL}': {exc}") from None
    except EpisodeError as exc:
        raise ToolCallFailed("execution_error", f"Error calling tool '{TERMINAL_TOOL}': {exc}") from None
    if isinstance(outcome, TerminalResult):
        return TerminalOutcome(_result_dict(command_text(outcome), outcome.model_dump(mode="json")))
    return TerminalOutcome(_result_dict(_final_text(outcome), outcome.model_dump(mode="json")),
                           reward=outcome.reward, done=True)


def episode_observation(episode: Episode) -> dict[str, Any]:
    """`reset`'s observation payload for an episode: the instruction, the episode's report (setup results,
    status, sandbox) and its tools; `done` when setup already ended it."""
    report = episode.report()
    observation = {
        "instruction": episode.task.instruction,
        "episode": report.model_dump(mode="json"),
        "tools": tool_list("input_schema", terminal=not report.done),
        "text": start_text(episode.task.instruction, report),
    }
    return {"observation": observation, "reward": None, "done": report.done}


def start_text(instruction: str, report: EpisodeReport) -> str:
    """The episode's opening as one text: the instruction, then how setup went."""
    ran = len(report.setup_results)
    if report.status.value == "running":
        setup = f"Setup: {ran} command(s) passed." if ran else "Setup: none."
    else:
        why = report.error.message if report.error is not None else report.status.value
        setup = f"The episode could not start ({report.status.value}): {why}."
    return f"{instruction}\n\n{setup}"


def command_text(result: TerminalResult) -> str:
    """The output, then on a line of its own how the command ended."""
    if result.timed_out:
        end = "[timed out: the command and its processes were killed]"
    else:
        end = f"[exit code {result.exit_code}]"
    separator = "\n" if result.output and not result.output.endswith("\n") else ""
    return f"{result.output}{separator}{end}"


def _final_text(report: EpisodeReport) -> str:
    passed = sum(1 for r in report.verify_results if r.ok)
    reward = "none (not scored)" if report.reward is None else f"{report.reward:g}"
    total = len(report.verify_results)
    text = f"Episode {report.status.value}: {passed}/{total} verify commands passed; reward {reward}"
    if report.error is not None:
        text += f" ({report.error.type}: {report.error.message})"
    return text


def _result_dict(text: str, data: dict[str, Any]) -> dict[str, Any]:
    return {
        "content": [{"type": "text", "text": text, "annotations": None, "meta": None}],
        "structured_content": data,
        "meta": None,
        "data": data,
        "is_error": False,
    }
