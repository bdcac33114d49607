"""Terminus as a standalone program: `terminus.core`'s conversation driven with the standard library only.

    python3 -I -S -B -c BOOT AGENTS_DIR SANDBOX_DIR CONFIG_JSON < instruction

(`terminus.agent.standalone_argv` builds that command.) It reads the instruction from stdin, its limits,
the model and the endpoint's URL from the config file, and the API key from `TERMINUS_API_KEY` (removed from
the environment its commands get). Commands run on this host, in the current directory, with
the sandbox's shell run on the host (`sandbox.shell.host.PersistentShell`). One JSON event per line goes to
stdout (see `terminus.core`).

This is how Terminus runs outside the server, e.g. as the reference the agent benchmark compares rollouts
with. In the server, `terminus.agent` drives the same conversation without starting any interpreter.
Start-up is what this program costs, so it imports only light modules: it speaks HTTP with `post_json`, a
minimal HTTP/1.1 client, not `urllib.request` (whose import alone costs more than the rest of the start-up).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

from .core import Chat, ChatFailed, conversation, message_of

__all__ = ["BOOT", "http_response_body", "main", "post_json"]

TOKEN_ENV = "TERMINUS_API_KEY"
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
"""Largest HTTP response (head and body) read from the endpoint."""
_RECV_CHUNK = 256 * 1024
BOOT = "import sys; sys.path[:0] = sys.argv[1:3]; from terminus.loop import main; sys.exit(main(sys.argv[3:]))"
"""A constant program: its arguments (the directories holding the `terminus` package and the sandbox's `shell`
package, the config path) carry no secret and no instruction."""


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


def chat(config: dict, token: str, body: dict) -> dict:
    """One chat completion; raises OSError/ValueError on failure."""
    data = post_json(
        config["base_url"].rstrip("/") + "/chat/completions",
        json.dumps(body).encode(),
        {"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        config["llm_timeout_s"],
    )
    return message_of(json.loads(data))


def emit(kind: str, **fields: object) -> None:
    sys.stdout.write(json.dumps({"type": kind, **fields}) + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    # The standalone program's own import: there the sandbox's shell package is the top-level `shell` (`BOOT`).
    from shell.host import PersistentShell

    with open(argv[0], encoding="utf-8") as handle:
        config = json.load(handle)
    os.makedirs(config["state_dir"], exist_ok=True)
    token = os.environ.pop(TOKEN_ENV, "")
    instruction = sys.stdin.buffer.read().decode("utf-8", "replace")  # whatever the locale
    shell = PersistentShell(config["state_dir"], os.getcwd(), os.environ, max_output_bytes=config["max_output_bytes"])
    steps = conversation(instruction, model=config["model"], max_turns=config["max_turns"],
                         loose=config["loose_parsing"], emit=emit)
    answer: object = None
    try:
        while True:
            need = steps.send(answer)
            if isinstance(need, Chat):
                try:
                    answer = chat(config, token, need.body)
                except (OSError, ValueError, RecursionError) as exc:
                    answer = ChatFailed(f"{type(exc).__name__}: {exc}")
            else:
                answer = shell.run(need.command, timeout_s=config["command_timeout_s"])
    except StopIteration as done:
        return done.value
