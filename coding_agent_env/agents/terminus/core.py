"""Terminus's conversation, without any I/O: what to ask the LLM, which commands to run, when to stop.

`conversation()` is a generator that yields what it needs and is sent the answer:

    Chat(body)     -> send the assistant message (a dict) of the chat completion for `body`, or `ChatFailed`
    Run(command)   -> send the command's `CommandOutcome` (see `sandbox.shell.runner`)

and returns the exit code: 0 after a `final_answer`, `EXIT_LLM_FAILED` when the LLM call fails,
`EXIT_OUT_OF_TURNS` when `max_turns` run out. Each turn is one non-streamed chat completion offering one
`terminal` tool (`command` or `final_answer`). Native tool calls are read with `arguments_to_call`; a reply
without them goes through `build_terminal_tool_call` (strict unless `loose`: prose is never run). Events
(`turn`, `command`, `text`, `parse_failure`, `final`, `error`) go to the `emit` callback.

Two drivers run it: `terminus.agent` in the server (the relay over loopback HTTP, commands as sandbox execs)
and `terminus.loop` as a standalone program (standard library only; a host shell). So both are the same agent.
Standard library only, and no `dataclasses`/`typing` at import, for the standalone program's start-up.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable, Generator

from .parse import ParseFailure, TerminalCall, arguments_to_call, build_terminal_tool_call

__all__ = [
    "EXIT_LLM_FAILED",
    "EXIT_OUT_OF_TURNS",
    "SYSTEM_PROMPT",
    "TERMINAL_TOOL",
    "Chat",
    "ChatFailed",
    "Run",
    "conversation",
    "message_of",
]

EXIT_LLM_FAILED = 1
EXIT_OUT_OF_TURNS = 3
MAX_TOOL_CALLS = 16
"""Tool calls acted on per assistant message (the rest are ignored)."""
EVENT_OUTPUT_CHARS = 2000
"""Characters of a command's output kept in its event (the model sees all of what the shell kept)."""

TERMINAL_TOOL: dict = {
    "type": "function",
    "function": {
        "name": "terminal",
        "description": (
            "Run one bash command in the task's working directory (cwd and exported variables persist "
            "between commands), or finish by giving `final_answer` instead of `command`."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "A bash command to run."},
                "final_answer": {"type": "string", "description": "Set only when the task is done."},
            },
        },
    },
}

SYSTEM_PROMPT = (
    "You are Terminus, an autonomous coding agent working in a Linux sandbox. Solve the user's task by "
    "calling the `terminal` tool: one bash command per call. You see each command's exit code and output "
    "(a long output is cut in the middle). The working directory and exported variables carry over to the "
    "next command; processes a command leaves in the background end with it. "
    "When the task is complete, call `terminal` with `final_answer` (a short summary) and no command. "
    "If you cannot call tools natively, answer with a JSON object "
    '{"name": "terminal", "arguments": {"command": "..."}} and nothing else.'
)


class Chat(namedtuple("Chat", ("body",))):
    """Ask the LLM: `body` is a whole `/chat/completions` request body (a dict, `stream` false)."""

    __slots__ = ()


class ChatFailed(namedtuple("ChatFailed", ("error",))):
    """The answer to a `Chat` when the call failed: `error` says why (no secret in it)."""

    __slots__ = ()


class Run(namedtuple("Run", ("command",))):
    """Run `command` with the persistent shell; answer with its `CommandOutcome`."""

    __slots__ = ()


Emit = Callable[..., None]
"""`emit(kind, **fields)`: one event."""


def message_of(answer: object) -> dict:
    """The assistant message of a parsed chat completion; ValueError when it has none."""
    try:
        message = answer["choices"][0]["message"]  # type: ignore[index]
    except (KeyError, IndexError, TypeError) as exc:
        raise ValueError(f"malformed chat completion ({type(exc).__name__})") from None
    if not isinstance(message, dict):
        raise ValueError("malformed chat completion (message is not an object)")
    return message


def conversation(
    instruction: str, *, model: str, max_turns: int, loose: bool, emit: Emit
) -> Generator[Chat | Run, object, int]:
    """See the module docstring."""
    messages: list[dict] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": instruction},
    ]
    for turn in range(max_turns):
        emit("turn", index=turn)
        answer = yield Chat({"model": model, "messages": list(messages), "tools": [TERMINAL_TOOL], "stream": False})
        if isinstance(answer, ChatFailed):
            emit("error", error=f"LLM call failed: {answer.error}"[:2000])
            return EXIT_LLM_FAILED
        assert isinstance(answer, dict)
        content = answer.get("content")
        if isinstance(content, str) and content.strip():
            emit("text", text=content[:4000])
        kept = {"role": "assistant", "content": content if isinstance(content, str) else None}
        tool_calls = answer.get("tool_calls")
        if isinstance(tool_calls, list) and tool_calls:
            # Only the calls acted on: each call in the history must be followed by its tool reply.
            kept["tool_calls"] = tool_calls[:MAX_TOOL_CALLS]
        messages.append(kept)
        for call_id, parsed in calls_of(answer, loose):
            if isinstance(parsed, ParseFailure):
                emit("parse_failure", reason=parsed.reason)
                messages.append(_feedback(call_id, f"Error: {parsed.reason}. Call the terminal tool."))
                continue
            if parsed.final_answer is not None:
                emit("final", text=parsed.final_answer)
                return 0
            # Text from JSON may hold lone surrogates, which no file or argument can hold: each becomes `?`.
            command = parsed.command.encode("utf-8", "replace").decode("utf-8")
            outcome = yield Run(command)
            emit("command", command=command, exit_code=outcome.exit_code, timed_out=outcome.timed_out,
                 output=outcome.output[-EVENT_OUTPUT_CHARS:])
            status = "timed out (killed)" if outcome.timed_out else f"exit code {outcome.exit_code}"
            messages.append(_feedback(call_id, f"[{status}]\n{outcome.output}"))
    emit("error", error=f"out of turns ({max_turns})")
    return EXIT_OUT_OF_TURNS


def calls_of(message: dict, loose: bool) -> list[tuple[str | None, TerminalCall | ParseFailure]]:
    """(tool_call_id, or None for a call written as text; the parsed call) for each call in an assistant message."""
    tool_calls = message.get("tool_calls")
    if isinstance(tool_calls, list) and tool_calls:
        out: list[tuple[str | None, TerminalCall | ParseFailure]] = []
        for call in tool_calls[:MAX_TOOL_CALLS]:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or function.get("name") != "terminal":
                out.append((_call_id(call), ParseFailure("unknown tool (only `terminal` exists)")))
                continue
            out.append((_call_id(call), arguments_to_call(function.get("arguments"))))
        return out
    content = message.get("content")
    return [(None, build_terminal_tool_call(content if isinstance(content, str) else "", loose=loose))]


def _call_id(call: object) -> str:
    value = call.get("id") if isinstance(call, dict) else None
    return value if isinstance(value, str) else "call"


def _feedback(call_id: str | None, text: str) -> dict:
    if call_id is None:
        return {"role": "user", "content": text}
    return {"role": "tool", "tool_call_id": call_id, "content": text}
