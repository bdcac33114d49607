"""The `terminal` tool (and `keystrokes`, for a live shell): descriptors and arguments.

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

__all__ = [
    "KEYSTROKES_DESCRIPTION", "KEYSTROKES_SCHEMA", "KEYSTROKES_TOOL", "TERMINAL_DESCRIPTION", "TERMINAL_SCHEMA",
    "TERMINAL_TOOL", "KeystrokesCall", "TerminalCall", "parse_keystrokes", "parse_terminal",
]

TERMINAL_TOOL = "terminal"
TERMINAL_DESCRIPTION = (
    "Run one shell command in the episode's sandbox (a persistent shell: the working directory, variables, "
    "functions and background jobs carry over between commands), or end the episode with a final answer, which "
    "is then verified and scored. Give exactly one of `command` and `final_answer`."
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


KEYSTROKES_TOOL = "keystrokes"
KEYSTROKES_DESCRIPTION = (
    "Type into the episode's terminal, as Terminus-2 does: the keys go to the live shell's input (a command line "
    "it runs, or what its foreground program reads, e.g. a `python3 -i` REPL or a prompt waiting for `y`), then "
    "wait `duration` seconds and return the output since the last call. End a line with \\n to submit it; `C-c` "
    "alone interrupts the foreground program. Needs a live shell (the local backend)."
)
MAX_KEYS_BYTES = 64 * 1024
MAX_DURATION_S = 60.0
KEYSTROKES_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "keystrokes": {"type": "string", "description": "The keys to type (\\n submits a line; `C-c` interrupts)."},
        "duration": {"type": "number", "default": 1.0, "minimum": 0, "maximum": MAX_DURATION_S,
                     "description": "Seconds to wait for output before returning."},
    },
    "required": ["keystrokes"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class KeystrokesCall:
    """Keys to type (`\\x03` for an interrupt) and how long to wait for their output."""

    keys: str
    duration_s: float


def parse_keystrokes(arguments: Any) -> KeystrokesCall:
    """`TerminalArgumentsError` for anything but `{"keystrokes": text, "duration": seconds}` within the limits."""
    if not isinstance(arguments, dict):
        raise TerminalArgumentsError("keystrokes arguments must be an object with keystrokes and duration")
    unknown = sorted(str(key) for key in arguments if key not in ("keystrokes", "duration"))
    if unknown:
        raise TerminalArgumentsError(f"unknown keystrokes argument(s): {', '.join(unknown[:5])}")
    keys = _text(arguments, "keystrokes", MAX_KEYS_BYTES)
    if not keys:
        raise TerminalArgumentsError("keystrokes is empty")
    duration = arguments.get("duration", 1.0)
    if isinstance(duration, bool) or not isinstance(duration, int | float) or not 0 <= duration <= MAX_DURATION_S:
        raise TerminalArgumentsError(f"duration must be a number of seconds from 0 to {MAX_DURATION_S:g}")
    return KeystrokesCall("\x03" if keys.strip() == "C-c" else keys, float(duration))
