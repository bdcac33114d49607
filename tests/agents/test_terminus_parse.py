"""`build_terminal_tool_call` and `arguments_to_call`: the accepted shapes, prose refused, and (hypothesis)
total and bounded on any input, deep nesting included. And the loop's HTTP response parsing and client."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coding_agent_env.agents.terminus.loop import http_response_body, post_json
from coding_agent_env.agents.terminus.parse import (
    MAX_DEPTH,
    MAX_TEXT_CHARS,
    ParseFailure,
    TerminalCall,
    _depth_ok,
    arguments_to_call,
    build_terminal_tool_call,
)

CMD = TerminalCall(command="ls -la")


def test_accepted_shapes() -> None:
    shapes = [
        '{"name": "terminal", "arguments": {"command": "ls -la"}}',
        '{"name": "terminal", "arguments": "{\\"command\\": \\"ls -la\\"}"}',
        '{"function": {"name": "terminal", "arguments": {"command": "ls -la"}}}',
        'Sure.\n<tool_call>{"name": "terminal", "arguments": {"command": "ls -la"}}</tool_call>',
        'Here:\n```json\n{"command": "ls -la"}\n```\n',
        "I will run terminal(command='ls -la') now",
        'terminal(command="""ls -la""")',
        'prose first {"command": "ls -la"} prose after',
    ]
    for text in shapes:
        assert build_terminal_tool_call(text) == CMD, text
    assert build_terminal_tool_call("terminal(final_answer='done')") == TerminalCall(final_answer="done")
    assert build_terminal_tool_call('{"final_answer": "ok"}') == TerminalCall(final_answer="ok")


def test_prose_is_not_a_command_unless_loose() -> None:
    prose = "I think we should run ls -la and then look around.\n```bash\nrm -rf /\n```"
    assert isinstance(build_terminal_tool_call(prose), ParseFailure)
    assert build_terminal_tool_call(prose, loose=True) == TerminalCall(command="rm -rf /\n")
    assert build_terminal_tool_call("just words", loose=True) == TerminalCall(command="just words")


def test_other_tools_and_bad_arguments_are_failures() -> None:
    for text in ['{"name": "python", "arguments": {"command": "x"}}', '{"command": 5}', '{"command": ""}',
                 "terminal(command=os.system('x'))", "terminal(command='unterminated"]:
        assert isinstance(build_terminal_tool_call(text), ParseFailure), text
    assert isinstance(arguments_to_call(json.dumps(json.dumps(json.dumps(json.dumps(json.dumps({"command": "x"})))))), ParseFailure)
    assert arguments_to_call(json.dumps(json.dumps({"command": "x"}))) == TerminalCall(command="x")


def test_deep_nesting_and_huge_text_are_bounded_failures() -> None:
    for text in ["[" * 100_000, "{" * 100_000 + "}" * 100_000, '{"a":' * 50_000 + "1" + "}" * 50_000,
                 "(" * 100_000, "x" * (MAX_TEXT_CHARS + 1)]:
        started = time.monotonic()
        assert isinstance(build_terminal_tool_call(text), ParseFailure)
        assert time.monotonic() - started < 2.0
    nested = '{"command": "x", "pad": ' + "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5) + "}"
    assert isinstance(arguments_to_call(nested), ParseFailure)
    assert isinstance(arguments_to_call({"command": ["x"]}), ParseFailure)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=2000), st.booleans())
def test_never_raises_on_any_text(text: str, loose: bool) -> None:
    result = build_terminal_tool_call(text, loose=loose)
    assert isinstance(result, (TerminalCall, ParseFailure))
    if isinstance(result, TerminalCall):
        assert (result.command is None) != (result.final_answer is None)


@settings(max_examples=300, deadline=None)
@given(json_values, st.sampled_from(["", "<tool_call>", "```json\n", "terminal(command="]))
def test_never_raises_on_json_shapes(value: object, prefix: str) -> None:
    text = prefix + json.dumps(value)
    assert isinstance(build_terminal_tool_call(text), (TerminalCall, ParseFailure))
    assert isinstance(arguments_to_call(value), (TerminalCall, ParseFailure))
    assert isinstance(arguments_to_call(json.dumps(value)), (TerminalCall, ParseFailure))


@settings(max_examples=50, deadline=None)
@given(st.integers(min_value=MAX_DEPTH + 1, max_value=200_000), st.sampled_from(["[", "{", "(", '{"a":']))
def test_deep_nesting_never_recurses(depth: int, opener: str) -> None:
    assert isinstance(build_terminal_tool_call(opener * depth), ParseFailure)
    assert isinstance(arguments_to_call(opener * depth), ParseFailure)


# The loop's HTTP client (`loop.post_json`): the relay answers non-streamed calls with a Content-Length body;
# a chunked body (another server, a proxy) must decode the same, and any bytes give a body or a clean error.


def _response(body: bytes, *, status: str = "200 OK", chunks: list[int] | None = None) -> bytes:
    if chunks is None:
        return f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
    out, pos = [f"HTTP/1.1 {status}\r\nTransfer-Encoding: chunked\r\n\r\n".encode()], 0
    for size in chunks:
        piece = body[pos : pos + size]
        pos += len(piece)
        if piece:
            out.append(b"%x\r\n%s\r\n" % (len(piece), piece))
    out.append(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body) - pos, body[pos:]) if pos < len(body) else b"0\r\n\r\n")
    return b"".join(out)


def _depth_by_walking(text: str) -> bool:
    """The plain character-by-character walk `parse._depth_ok` must agree with."""
    depth, in_string, escaped = 0, False, False
    for char in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (char == "\\", char != '"')
        elif char == '"':
            in_string = True
        elif char in "[{(":
            depth += 1
            if depth > MAX_DEPTH:
                return False
        elif char in "]})" and depth > 0:
            depth -= 1
    return True


@given(st.one_of(st.text(alphabet='[]{}()"\\ax', max_size=400),
                 st.text(alphabet='[[[[{{((()"\\a', min_size=MAX_DEPTH, max_size=200)))  # often too deep
def test_depth_check_visits_only_what_matters_and_agrees_with_a_plain_walk(text: str) -> None:
    assert _depth_ok(text) == _depth_by_walking(text)


@pytest.mark.parametrize(("text", "ok"), [
    ("[" * MAX_DEPTH, True),
    ("[" * (MAX_DEPTH + 1), False),
    ("(" * (MAX_DEPTH + 1), False),
    ("()" * 100 + "{" * MAX_DEPTH, True),
    ('"' + "[" * (MAX_DEPTH + 5) + '"', True),  # inside a string
    ('"\\"' + "[" * (MAX_DEPTH + 1), True),  # the escaped quote does not end the string
    ('"\\\\"' + "[" * (MAX_DEPTH + 1), False),  # an escaped backslash does not escape the quote
])
def test_depth_check_cases(text: str, ok: bool) -> None:
    assert _depth_ok(text) is ok and _depth_by_walking(text) is ok


@given(st.binary(max_size=2000), st.lists(st.integers(min_value=1, max_value=300), max_size=20))
@settings(max_examples=200, deadline=None)
def test_http_bodies_decode_whole(body: bytes, chunks: list[int]) -> None:
    assert http_response_body(_response(body)) == body
    assert http_response_body(_response(body, chunks=chunks)) == body


def test_http_errors_and_truncation_are_clean() -> None:
    with pytest.raises(OSError, match="HTTP 429"):
        http_response_body(_response(b'{"error": "slow down"}', status="429 Too Many Requests"))
    whole = _response(b"x" * 100)
    with pytest.raises(ValueError):
        http_response_body(whole[:-1])
    chunked = _response(b"x" * 100, chunks=[10, 10])
    with pytest.raises(ValueError):
        http_response_body(chunked[:-7])


@given(st.binary(max_size=400))
@settings(max_examples=300, deadline=None)
def test_http_parse_never_raises_anything_else(data: bytes) -> None:
    for candidate in (data, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + data):
        try:
            http_response_body(candidate)
        except (OSError, ValueError):
            pass


def test_post_json_sends_one_request_and_bounds_the_wait() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        seen: list[bytes] = []

        def answer_then_hang() -> None:
            conn, _ = server.accept()
            with conn:
                data = b""
                while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < 5:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                seen.append(data)
                conn.sendall(_response(b'{"ok": 1}', chunks=[3, 3]))
            hung, _ = server.accept()  # the second request gets no answer at all
            with hung:
                hung.recv(65536)
                done.wait(10)

        done = threading.Event()
        thread = threading.Thread(target=answer_then_hang)
        thread.start()
        try:
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            assert post_json(url, b"hello", {"Authorization": "Bearer t"}, 10) == b'{"ok": 1}'
            head = seen[0].partition(b"\r\n\r\n")[0].decode()
            assert head.startswith("POST /v1/chat/completions HTTP/1.1\r\n") and "Authorization: Bearer t" in head
            started = time.monotonic()
            with pytest.raises(OSError):  # TimeoutError
                post_json(url, b"hello", {}, 0.5)
            assert time.monotonic() - started < 5
        finally:
            done.set()
            thread.join(10)
    with pytest.raises(ValueError):
        post_json("https://example.invalid/v1", b"", {}, 1)
