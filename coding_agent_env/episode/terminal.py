"""The `terminal` tool: its descriptor and its arguments.

Upstream's shape: `{"command": str, "final_answer": str}`, where a client sends both keys and leaves one
empty. Exactly one must be non-blank: a command runs in the episode's persistent shell; a final answer ends
the episode and is verified. Both given, neither given, a non-string, a NUL byte, a lone surrogate (JSON's
`"\\ud800"` decodes to one: it is no character, and no file or argument can hold it), a command over
`WireLimits.MAX_COMMAND_BYTES` or an answer over `WireLimits.MAX_FINAL_ANSWER_BYTES` (UTF-8) or any other key
is a `TerminalArgumentsError`, and nothing runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from coding_agent_env.episode.errors import TerminalArgumentsError
from coding_agent_env.settings import WireLimits

__all__ = ["TERMINAL_DESCRIPTION", "TERMINAL_SCHEMA", "TERMINAL_TOOL", "TerminalCall", "parse_terminal"]

TERMINAL_TOOL = "terminal"
TERMINAL_DESCRIPTION = (
    "Run one shell command in the episode's sandbox (a persistent shell: the working directory and exported "
    "variables carry over between commands), or end the episode with a final answer, which is then verified "
    "and scored. Give exactly one of `command` and `final_answer`."
)
TERMINAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "command": {"type": "string", "default": "", "description": "The shell command to run."},
        "final_answer": {
            "type": "string",
            "default": "",
            "description": "Your final answer; ends the episode (verify reads it at $FINAL_ANSWER_FILE).",
        },
    },
    "additionalProperties": False,
}


@dataclass(frozen=True)
class TerminalCall:
    """One `terminal` call: a command to run, or (`command is None`) a final answer."""

    command: str | None = None
    final_answer: str | None = None


def parse_terminal(arguments: Any) -> TerminalCall:
    if not isinstance(arguments, dict):
        raise TerminalArgumentsError("terminal arguments must be an object with command or final_answer")
    unknown = sorted(str(key) for key in arguments if key not in ("command", "final_answer"))
    if unknown:
        raise TerminalArgumentsError(f"unknown terminal argument(s): {', '.join(unknown[:5])}")
    command = _text(arguments, "command", WireLimits.MAX_COMMAND_BYTES)
    answer = _text(arguments, "final_answer", WireLimits.MAX_FINAL_ANSWER_BYTES)
    if command.strip() and answer.strip():
        raise TerminalArgumentsError("give either command or final_answer, not both")
    if command.strip():
        return TerminalCall(command=command)
    if answer.strip():
        return TerminalCall(final_answer=answer)
    raise TerminalArgumentsError("give a command or a final_answer (both are empty)")


def _text(arguments: dict[str, Any], key: str, max_bytes: int) -> str:
    value = arguments.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise TerminalArgumentsError(f"{key} must be a string, not {type(value).__name__}")
    if "\x00" in value:
        raise TerminalArgumentsError(f"{key} must not contain NUL bytes")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        # Where, not what: messages never echo argument values.
        raise TerminalArgumentsError(
            f"{key} must be valid Unicode text: it holds a lone surrogate (U+{ord(value[exc.start]):04X} at "
            f"character {exc.start})"
        ) from None
    if size > max_bytes:
        raise TerminalArgumentsError(f"{key} longer than {max_bytes} bytes (UTF-8)")
    return value
