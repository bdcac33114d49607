"""The Terminus agent loop. Standard library only: it runs inside the sandbox as `python3 -I`.

    python3 -I -c BOOT PKG_DIR CONFIG_JSON < instruction

It reads the instruction from stdin, its limits and the relay's URL from the config file, and the relay
token from `TERMINUS_API_KEY` (which it removes from the environment its commands get). Each turn is one
non-streamed `POST /chat/completions` through the relay offering one `terminal` tool (`command` or
`final_answer`). Native tool calls are read with `arguments_to_call`; a reply without them goes through
`build_terminal_tool_call` (strict: prose is never run). Commands run with persistent shell state
(`shell.PersistentShell`). One JSON event per line goes to stdout: `turn`, `command`, `text`, `parse_failure`,
`final`, `error`.

Exit codes: 0 after a `final_answer`, 1 when the LLM call fails, 3 when `max_turns` run out.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any

from .parse import ParseFailure, TerminalCall, arguments_to_call, build_terminal_tool_call
from .shell import PersistentShell

__all__ = ["TERMINAL_TOOL", "main"]

TOKEN_ENV = "TERMINUS_API_KEY"
EXIT_LLM_FAILED = 1
EXIT_OUT_OF_TURNS = 3
MAX_RESPONSE_BYTES = 16 * 1024 * 1024

TERMINAL_TOOL: dict[str, Any] = {
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
    "calling the `terminal` tool: one bash command per call. You see each command's exit code and output. "
    "When the task is complete, call `terminal` with `final_answer` (a short summary) and no command. "
    "If you cannot call tools natively, answer with a JSON object "
    '{"name": "terminal", "arguments": {"command": "..."}} and nothing else.'
)


def emit(kind: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"type": kind, **fields}) + "\n")
    sys.stdout.flush()


def chat(config: dict[str, Any], token: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """One chat completion through the relay; raises OSError/ValueError on failure."""
    body = {"model": config["model"], "messages": messages, "tools": [TERMINAL_TOOL], "stream": False}
    request = urllib.request.Request(
        config["base_url"].rstrip("/") + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=config["llm_timeout_s"]) as response:
        data = response.read(MAX_RESPONSE_BYTES + 1)
    if len(data) > MAX_RESPONSE_BYTES:
        raise ValueError("response too large")
    answer = json.loads(data)
    message = answer["choices"][0]["message"]
    if not isinstance(message, dict):
        raise ValueError("malformed response")
    return message


def calls_of(message: dict[str, Any], loose: bool) -> list[tuple[str | None, TerminalCall | ParseFailure]]:
    """(tool_call_id or None for a text call, parsed call) for each call in an assistant message."""
    tool_calls = message.get("tool_calls")
    if isinstance(tool_calls, list) and tool_calls:
        out: list[tuple[str | None, TerminalCall | ParseFailure]] = []
        for call in tool_calls[:16]:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or function.get("name") != "terminal":
                out.append((_call_id(call), ParseFailure("unknown tool (only `terminal` exists)")))
                continue
            out.append((_call_id(call), arguments_to_call(function.get("arguments"))))
        return out
    return [(None, build_terminal_tool_call(message.get("content") or "", loose=loose))]


def _call_id(call: object) -> str:
    value = call.get("id") if isinstance(call, dict) else None
    return value if isinstance(value, str) else "call"


def _feedback(call_id: str | None, text: str) -> dict[str, Any]:
    if call_id is None:
        return {"role": "user", "content": text}
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def step(config: dict[str, Any], shell: PersistentShell, message: dict[str, Any]) -> tuple[bool, list[dict[str, Any]]]:
    """Act on one assistant message: (finished, messages to append after it)."""
    replies: list[dict[str, Any]] = []
    for call_id, parsed in calls_of(message, config["loose_parsing"]):
        if isinstance(parsed, ParseFailure):
            emit("parse_failure", reason=parsed.reason)
            replies.append(_feedback(call_id, f"Error: {parsed.reason}. Call the terminal tool."))
            continue
        if parsed.final_answer is not None:
            emit("final", text=parsed.final_answer)
            return True, replies
        assert parsed.command is not None
        outcome = shell.run(parsed.command, timeout_s=config["command_timeout_s"])
        emit("command", command=parsed.command, exit_code=outcome.exit_code, timed_out=outcome.timed_out,
             output=outcome.output[-2000:])
        status = "timed out (killed)" if outcome.timed_out else f"exit code {outcome.exit_code}"
        replies.append(_feedback(call_id, f"[{status}]\n{outcome.output}"))
    return False, replies


def run(config: dict[str, Any], token: str, instruction: str, shell: PersistentShell) -> int:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": instruction},
    ]
    for turn in range(config["max_turns"]):
        emit("turn", index=turn)
        try:
            message = chat(config, token, messages)
        except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
            emit("error", error=f"LLM call failed: {type(exc).__name__}: {exc}"[:2000])
            return EXIT_LLM_FAILED
        if isinstance(message.get("content"), str) and message["content"].strip():
            emit("text", text=message["content"][:4000])
        kept = {"role": "assistant", "content": message.get("content")}
        if message.get("tool_calls"):
            kept["tool_calls"] = message["tool_calls"]
        messages.append(kept)
        finished, replies = step(config, shell, message)
        if finished:
            return 0
        messages.extend(replies)
    emit("error", error=f"out of turns ({config['max_turns']})")
    return EXIT_OUT_OF_TURNS


def main(argv: list[str]) -> int:
    with open(argv[0], encoding="utf-8") as handle:
        config = json.load(handle)
    os.makedirs(config["state_dir"], exist_ok=True)
    token = os.environ.pop(TOKEN_ENV, "")
    instruction = sys.stdin.read()
    shell = PersistentShell(config["state_dir"], os.getcwd(), os.environ,
                            max_output_bytes=config["max_output_bytes"])
    return run(config, token, instruction, shell)
