"""The Terminus agent loop. Standard library only: it runs inside the sandbox as `python3 -I -S -B`.

    python3 -I -S -B -c BOOT PKG_DIR CONFIG_JSON < instruction

It reads the instruction from stdin, its limits and the relay's URL from the config file, and the relay
token from `TERMINUS_API_KEY` (which it removes from the environment its commands get). Each turn is one
non-streamed `POST /chat/completions` through the relay offering one `terminal` tool (`command` or
`final_answer`). Native tool calls are read with `arguments_to_call`; a reply without them goes through
`build_terminal_tool_call` (strict: prose is never run). Commands run with persistent shell state
(`shell.PersistentShell`). One JSON event per line goes to stdout: `turn`, `command`, `text`, `parse_failure`,
`final`, `error`.

Start-up is on every rollout's critical path, so this module and its two siblings import only light modules
(`json`, `socket`, `subprocess`, `collections`): the relay is spoken to by `post_json`, a minimal HTTP/1.1
client, not `urllib.request` (whose import alone costs more than the rest of the loop's start-up).

Exit codes: 0 after a `final_answer`, 1 when the LLM call fails, 3 when `max_turns` run out.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

from .parse import ParseFailure, TerminalCall, arguments_to_call, build_terminal_tool_call
from .shell import PersistentShell

__all__ = ["TERMINAL_TOOL", "http_response_body", "main", "post_json"]

TOKEN_ENV = "TERMINUS_API_KEY"
EXIT_LLM_FAILED = 1
EXIT_OUT_OF_TURNS = 3
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
"""Largest HTTP response (head and body) read from the relay."""
_RECV_CHUNK = 256 * 1024

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
    "calling the `terminal` tool: one bash command per call. You see each command's exit code and output. "
    "When the task is complete, call `terminal` with `final_answer` (a short summary) and no command. "
    "If you cannot call tools natively, answer with a JSON object "
    '{"name": "terminal", "arguments": {"command": "..."}} and nothing else.'
)


def emit(kind: str, **fields: object) -> None:
    sys.stdout.write(json.dumps({"type": kind, **fields}) + "\n")
    sys.stdout.flush()


def post_json(url: str, body: bytes, headers: dict, timeout_s: float) -> bytes:
    """POST `body` to an `http://host:port/path` URL and return the body of its 200 response.

    HTTP/1.1 with `Connection: close`, so the response ends at EOF; a chunked body is decoded. `timeout_s`
    bounds the whole exchange. Raises OSError (connection, timeout, non-200 status) or ValueError (not an
    http:// URL, malformed or oversized response). The relay's URL inside a sandbox is always plain HTTP on
    loopback, so TLS is not needed here.
    """
    if not url.startswith("http://"):
        raise ValueError(f"only http:// URLs are supported, not {url[:40]!r}")
    authority, _, path = url[len("http://") :].partition("/")
    host, _, port = authority.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"URL without host:port: {url[:80]!r}")
    host = host.strip("[]")  # an IPv6 literal
    head = [f"POST /{path} HTTP/1.1", f"Host: {authority}", f"Content-Length: {len(body)}", "Connection: close"]
    head += [f"{name}: {value}" for name, value in headers.items()]
    deadline = time.monotonic() + timeout_s
    with socket.create_connection((host, int(port)), timeout=timeout_s) as conn:
        conn.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        data = _read_to_eof(conn, deadline)
    return http_response_body(data)


def _read_to_eof(conn: socket.socket, deadline: float) -> bytes:
    parts: list[bytes] = []
    size = 0
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("LLM response not complete within llm_timeout_s")
        conn.settimeout(remaining)
        chunk = conn.recv(_RECV_CHUNK)
        if not chunk:
            return b"".join(parts)
        size += len(chunk)
        if size > MAX_RESPONSE_BYTES:
            raise ValueError("response too large")
        parts.append(chunk)


def http_response_body(data: bytes) -> bytes:
    """The body of a whole HTTP/1.1 response (as read to EOF): its Content-Length prefix, or its chunks
    decoded. Raises OSError for a status other than 200 and ValueError for anything malformed or cut short;
    nothing else, whatever the bytes."""
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        raise ValueError("truncated HTTP response")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    fields = status_line.split(" ", 2)
    if len(fields) < 2 or not fields[0].startswith("HTTP/"):
        raise ValueError(f"malformed status line {status_line[:80]!r}")
    if fields[1] != "200":
        raise OSError(f"HTTP {status_line[9:80]}: {body[:500].decode('utf-8', 'replace')}")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return _dechunk(body)
    length = headers.get("content-length")
    if length is not None:
        if not length.isdigit() or len(body) < int(length):
            raise ValueError("truncated HTTP response body")
        return body[: int(length)]
    return body


def _dechunk(data: bytes) -> bytes:
    """The payload of a chunked body (trailers ignored); ValueError when it is malformed or cut short."""
    parts: list[bytes] = []
    pos = 0
    while True:
        line_end = data.find(b"\r\n", pos)
        if line_end < 0:
            raise ValueError("truncated chunked body")
        size = int(data[pos:line_end].split(b";", 1)[0], 16)
        if size < 0:
            raise ValueError("negative chunk size")
        if size == 0:
            return b"".join(parts)
        start = line_end + 2
        if len(data) < start + size + 2:
            raise ValueError("truncated chunked body")
        parts.append(data[start : start + size])
        pos = start + size + 2


def chat(config: dict, token: str, messages: list[dict]) -> dict:
    """One chat completion through the relay; raises OSError/ValueError on failure."""
    body = {"model": config["model"], "messages": messages, "tools": [TERMINAL_TOOL], "stream": False}
    data = post_json(
        config["base_url"].rstrip("/") + "/chat/completions",
        json.dumps(body).encode(),
        {"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        config["llm_timeout_s"],
    )
    answer = json.loads(data)
    message = answer["choices"][0]["message"]
    if not isinstance(message, dict):
        raise ValueError("malformed response")
    return message


def calls_of(message: dict, loose: bool) -> list[tuple[str | None, TerminalCall | ParseFailure]]:
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


def _feedback(call_id: str | None, text: str) -> dict:
    if call_id is None:
        return {"role": "user", "content": text}
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def step(config: dict, shell: PersistentShell, message: dict) -> tuple[bool, list[dict]]:
    """Act on one assistant message: (finished, messages to append after it)."""
    replies: list[dict] = []
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


def run(config: dict, token: str, instruction: str, shell: PersistentShell) -> int:
    messages: list[dict] = [
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
    instruction = sys.stdin.buffer.read().decode("utf-8", "replace")  # whatever the sandbox's locale
    shell = PersistentShell(config["state_dir"], os.getcwd(), os.environ,
                            max_output_bytes=config["max_output_bytes"])
    return run(config, token, instruction, shell)
