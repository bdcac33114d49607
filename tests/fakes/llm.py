"""A scripted fake OpenAI-compatible LLM: an ASGI app plus a loopback server that runs it in a thread.

`POST /v1/chat/completions` answers with the next scripted `Reply` (the last one repeats). Streamed answers
are SSE the way OpenAI and vLLM send them: a role chunk, content and reasoning deltas, tool-call deltas
(id and name first, arguments in pieces), a finish chunk (`tool_calls` when the reply calls tools), a usage
chunk when `stream_options.include_usage` is set, then `data: [DONE]`. With `logprobs` the content carries
per-token logprobs (and `top_logprobs` alternatives); with vLLM's `return_token_ids` the response carries
`prompt_token_ids` and per-choice `token_ids`. Streamed and non-streamed answers agree token for token.

With `native` it also serves agent dialects itself, like an upstream that speaks them (Anthropic's
`/v1/messages` with `x-api-key`, `/v1/responses` with a bearer, Google's `/v1beta/models/M:generateContent` and
`:streamGenerateContent` with `x-goog-api-key`): the request is read through the relay's own translation to
chat and the scripted reply written back in the dialect the same way (the real agents accept those answers from
the relay, so they are well-formed); for the relay's pass-through tests.

Every request is kept in `FakeLLM.requests` (body, headers, path) so tests can see what reached "the model".
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import uvicorn

from tests.helpers import wait_until

__all__ = ["FakeLLM", "FakeLLMServer", "Reply", "SeenRequest"]

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

_START_DEADLINE_S = 10.0


@dataclass(frozen=True)
class Reply:
    """One scripted answer. `status` != 200 answers with an OpenAI error body instead."""

    content: str | None = "ok"
    reasoning: str | None = None
    tool_calls: tuple[tuple[str, str], ...] = ()
    """(name, JSON arguments) pairs."""
    status: int = 200
    error_message: str = "scripted failure"
    hang: bool = False
    """Never answer (until the server stops): for timeout and cancellation tests."""
    drop_after_chunks: int | None = None
    """Streamed: close the connection after this many chunks, without [DONE]."""
    token_delay_s: float = 0.0
    """Streamed: pause between content tokens, like a real model generating."""
    trailer_delay_s: float | None = None
    """Streamed: after the answer's last event, pause this long and send an SSE comment before ending (an
    upstream holding the stream open, so a client that hangs up on the last event is seen to have gone)."""
    logprobs_fault: Literal["nan", "short", "positive"] | None = None
    """Bad engine output for this reply: a NaN logprob, one logprob too few, or a positive one."""


@dataclass(frozen=True)
class SeenRequest:
    path: str
    method: str
    headers: dict[str, str]
    body: dict[str, Any] | None


@dataclass
class FakeLLM:
    """The ASGI app. `script` is consumed in order; its last reply repeats."""

    script: list[Reply] = field(default_factory=lambda: [Reply()])
    requests: list[SeenRequest] = field(default_factory=list)
    api_key: str | None = None
    """When set, calls without `Authorization: Bearer <api_key>` get 401."""
    tokens_as_ids: bool = False
    """Like vLLM's `--return-tokens-as-token-ids`: logprob tokens are `token_id:N` strings."""
    omit_token_ids: bool = False
    """An engine that ignores `return_token_ids` (no `prompt_token_ids`, no `token_ids`)."""
    by_conversation: bool = False
    """Pick each reply by the number of assistant messages in the request (the conversation's turn), not by
    arrival: concurrent conversations then each get the whole script."""
    vocab: dict[str, int] = field(default_factory=dict)
    """The fake engine's tokenizer: each distinct piece gets the next id, shared by every call."""
    native: frozenset[str] = frozenset()
    """Agent dialects served natively (anthropic, responses, google); see the module docstring."""
    _served: int = 0

    def token_id(self, piece: str) -> int:
        return self.vocab.setdefault(piece, 100 + len(self.vocab))

    def reset(self, script: list[Reply]) -> None:
        """Start a new scripted session: `script` from its first reply, requests forgotten."""
        self.script = script
        self.requests.clear()
        self._served = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        body = json.loads(raw) if raw else None
        self.requests.append(SeenRequest(scope["path"], scope["method"], headers, body))
        dialect = _native_dialect(scope["path"]) if self.native else None
        if dialect is not None and dialect[0] in self.native and isinstance(body, dict):
            await self._native(dialect, headers, body, send)
            return
        if self.api_key is not None and headers.get("authorization") != f"Bearer {self.api_key}":
            await _json(send, 401, {"error": {"message": "bad key", "type": "authentication_error"}})
            return
        if scope["path"] != "/v1/chat/completions" or not isinstance(body, dict):
            await _json(send, 404, {"error": {"message": "not found", "type": "not_found"}})
            return
        position = self._served
        if self.by_conversation:
            position = sum(1 for m in body.get("messages") or [] if isinstance(m, dict) and m.get("role") == "assistant")
        reply = self.script[min(position, len(self.script) - 1)]
        self._served += 1
        await self._answer(reply, body, send)

    async def _native(self, dialect: tuple[str, Any, Any], headers: dict[str, str], body: dict[str, Any],
                      send: Send) -> None:
        name, to_chat, (whole, stream) = dialect
        key = {"anthropic": headers.get("x-api-key"), "google": headers.get("x-goog-api-key")}.get(
            name, headers.get("authorization", "").removeprefix("Bearer "))
        if self.api_key is not None and key != self.api_key:
            await _json(send, 401, {"error": {"message": "bad key", "type": "authentication_error"}})
            return
        try:
            chat = to_chat(body)
        except ValueError:  # what the relay's text-only translation refuses (images), a native upstream reads
            chat = {"model": body.get("model"), "messages": [], "stream": body.get("stream") is True}
        position = self._served
        if self.by_conversation:
            messages = chat.get("messages") or []
            position = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
        reply = self.script[min(position, len(self.script) - 1)]
        self._served += 1
        if reply.status != 200:
            await _json(send, reply.status, {"error": {"message": reply.error_message, "type": "scripted"}})
            return
        answer = _Answer(reply, chat, self)
        if chat.get("stream") is not True:
            await _json(send, 200, whole(answer.whole(), chat.get("model")))
            return
        translator = stream(chat.get("model"))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        async for chunk in answer.paced_chunks():
            if data := translator.feed(chunk):
                await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": translator.finish(), "more_body": True})
        await _trailer(reply, send)

    async def _answer(self, reply: Reply, body: dict[str, Any], send: Send) -> None:
        if reply.hang:
            await asyncio.Event().wait()
        if reply.status != 200:
            error = {"error": {"message": reply.error_message, "type": "scripted", "code": reply.status}}
            await _json(send, reply.status, error)
            return
        answer = _Answer(reply, body, self)
        if body.get("stream") is True:
            await answer.stream(send)
        else:
            await _json(send, 200, answer.whole())


class _Answer:
    """One reply rendered for one request: the same tokens whether streamed or not.

    Token ids behave like an engine's: the prompt is the chat rendering of the request's messages (a role
    marker, the content's pieces, each tool call as one piece with its arguments re-rendered from their parsed
    JSON as a chat template does, an end marker; then the assistant marker), tokenized by the app's shared
    vocabulary; the completion is the reply's pieces plus the end marker. So a call's prompt and completion
    are a token prefix of the next call's prompt whenever the agent sends the conversation back.
    """

    def __init__(self, reply: Reply, body: dict[str, Any], app: FakeLLM) -> None:
        self.reply = reply
        self.app = app
        self.model = str(body.get("model"))
        self.logprobs = body.get("logprobs") is True
        self.top = int(body.get("top_logprobs") or 0)
        self.token_ids = body.get("return_token_ids") is True and not app.omit_token_ids
        self.usage_chunk = bool((body.get("stream_options") or {}).get("include_usage"))
        self.call_id = uuid.uuid4().hex[:12]  # unique per reply, as an engine's tool-call ids are
        self.tokens = _pieces(reply.content)
        tool_pieces = [_tool_piece(name, args) for name, args in reply.tool_calls]
        self.sampled = [*self.tokens, *tool_pieces, _END]
        self.prompt_ids = [app.token_id(piece) for piece in _render(body.get("messages"))]
        self.finish = "tool_calls" if reply.tool_calls else "stop"
        n_completion = len(self.sampled)
        self.usage = {
            "prompt_tokens": len(self.prompt_ids),
            "completion_tokens": n_completion,
            "total_tokens": len(self.prompt_ids) + n_completion,
        }

    def _token_id(self, i: int) -> int:
        return self.app.token_id(self.sampled[i])

    def _logprob(self, i: int) -> dict[str, Any]:
        value = -0.125 * (i + 1)
        if self.reply.logprobs_fault == "nan" and i == 0:
            value = float("nan")
        elif self.reply.logprobs_fault == "positive" and i == 0:
            value = 0.5
        token = f"token_id:{self._token_id(i)}" if self.app.tokens_as_ids else self.sampled[i]
        entry: dict[str, Any] = {"token": token, "logprob": value, "bytes": None}
        entry["top_logprobs"] = [{"token": f"alt{k}", "logprob": -1.0 - k, "bytes": None} for k in range(self.top)]
        return entry

    def _logprob_entries(self, positions: range) -> list[dict[str, Any]]:
        last = len(self.sampled) - 1
        return [self._logprob(i) for i in positions if not (self.reply.logprobs_fault == "short" and i == last)]

    def _tool_calls(self) -> list[dict[str, Any]]:
        return [
            {"id": f"call_{self.call_id}_{i}", "type": "function", "function": {"name": name, "arguments": args}}
            for i, (name, args) in enumerate(self.reply.tool_calls)
        ]

    def _head(self) -> dict[str, Any]:
        return {"id": "chatcmpl-fake", "created": 1_700_000_000, "model": self.model}

    def whole(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.reply.content}
        if self.reply.reasoning:
            message["reasoning_content"] = self.reply.reasoning
        if self.reply.tool_calls:
            message["tool_calls"] = self._tool_calls()
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": self.finish}
        if self.logprobs:
            choice["logprobs"] = {"content": self._logprob_entries(range(len(self.sampled)))}
        out = {**self._head(), "object": "chat.completion", "choices": [choice], "usage": self.usage}
        if self.token_ids:
            choice["token_ids"] = [self._token_id(i) for i in range(len(self.sampled))]
            out["prompt_token_ids"] = self.prompt_ids
        return out

    def _extras(self, chunk: dict[str, Any], positions: range) -> dict[str, Any]:
        """Stream the sampled positions' ids and logprobs with `chunk`, as vLLM does."""
        if self.logprobs:
            chunk["choices"][0]["logprobs"] = {"content": self._logprob_entries(positions)}
        if self.token_ids:
            chunk["choices"][0]["token_ids"] = [self._token_id(i) for i in positions]
        return chunk

    def chunks(self) -> list[dict[str, Any]]:
        first = self._chunk({"role": "assistant", "content": ""})
        if self.token_ids:
            first["prompt_token_ids"] = self.prompt_ids
            first["choices"][0]["token_ids"] = []
        out = [first]
        if self.reply.reasoning:
            out.append(self._chunk({"reasoning_content": self.reply.reasoning}))
        for i, token in enumerate(self.tokens):
            out.append(self._extras(self._chunk({"content": token}), range(i, i + 1)))
        for i, call in enumerate(self._tool_calls()):
            args = call["function"]["arguments"]
            half = len(args) // 2
            head = {"index": i, "id": call["id"], "type": "function", "function": {"name": call["function"]["name"], "arguments": args[:half]}}
            position = len(self.tokens) + i
            out.append(self._extras(self._chunk({"tool_calls": [head]}), range(position, position + 1)))
            out.append(self._chunk({"tool_calls": [{"index": i, "function": {"arguments": args[half:]}}]}))
        last = len(self.sampled) - 1
        out.append(self._extras(self._chunk({}, finish=self.finish), range(last, last + 1)))
        if self.usage_chunk:
            out.append({**self._head(), "object": "chat.completion.chunk", "choices": [], "usage": self.usage})
        return out

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return {**self._head(), "object": "chat.completion.chunk", "choices": [choice]}

    async def paced_chunks(self) -> AsyncIterator[dict[str, Any]]:
        """`chunks()`, each content token after `reply.token_delay_s`, like a real model generating."""
        for chunk in self.chunks():
            if self.reply.token_delay_s and chunk["choices"] and "content" in chunk["choices"][0]["delta"]:
                await asyncio.sleep(self.reply.token_delay_s)
            yield chunk

    async def stream(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        n = 0
        async for chunk in self.paced_chunks():
            if self.reply.drop_after_chunks is not None and n >= self.reply.drop_after_chunks:
                raise ConnectionAbortedError("scripted disconnect")
            n += 1
            await send({"type": "http.response.body", "body": f"data: {json.dumps(chunk)}\n\n".encode(), "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": True})
        await _trailer(self.reply, send)


_END = "<|end|>"


async def _trailer(reply: Reply, send: Send) -> None:
    """End a stream: at once, or after `reply.trailer_delay_s` and a comment line."""
    if reply.trailer_delay_s is not None:
        await asyncio.sleep(reply.trailer_delay_s)
        await send({"type": "http.response.body", "body": b": trailer\n\n", "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def _native_dialect(path: str) -> tuple[str, Any, Any] | None:
    """(name, request -> chat, (whole translation, stream translator)) for a dialect path, else None."""
    from coding_agent_env.llm.dialects import anthropic, google, responses

    if path == "/v1/messages":
        return "anthropic", anthropic.to_chat, (anthropic.response_from_chat, anthropic.AnthropicStream)
    if path == "/v1/responses":
        return "responses", responses.to_chat, (responses.response_from_chat, responses.ResponsesStream)
    found = google.parse_path(path)
    if found is not None:
        model, streamed = found
        return ("google", lambda body: google.to_chat(body, model, streamed),
                (google.response_from_chat, google.GoogleStream))
    return None


def _pieces(text: str | None) -> list[str]:
    """The fake's tokenization of a text: words, each with its following space."""
    if not text:
        return []
    words = text.split(" ")
    return [w if i == len(words) - 1 else w + " " for i, w in enumerate(words)]


def _tool_piece(name: Any, arguments: Any) -> str:
    """A tool call as the template renders it: arguments re-rendered from their parsed JSON (agents re-serialise
    the string they were given, so bytes are not kept)."""
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        parsed = arguments
    return f"<tool_call>{json.dumps({'name': name, 'arguments': parsed})}</tool_call>"


def _text(content: Any) -> str | None:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else None


def _render(messages: Any) -> list[str]:
    """The chat rendering of `messages` as pieces, ending with the generation prompt."""
    out: list[str] = []
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, dict):
            continue
        out.append(f"<|{message.get('role')}|>")
        out.extend(_pieces(_text(message.get("content"))))
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {} if isinstance(call, dict) else {}
            out.append(_tool_piece(function.get("name"), function.get("arguments")))
        out.append(_END)
    out.append("<|assistant|>")
    return out


async def _json(send: Send, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


class FakeLLMServer:
    """Serves a `FakeLLM` on 127.0.0.1 (OS-chosen port) from a uvicorn server in its own thread.

    `with FakeLLMServer(app) as server: server.base_url` -> `http://127.0.0.1:PORT/v1`. Exiting stops the
    server and joins its thread (hung replies are cancelled).
    """

    def __init__(self, app: FakeLLM | None = None) -> None:
        self.app = app or FakeLLM()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port: int = self._sock.getsockname()[1]
        config = uvicorn.Config(self.app, lifespan="off", log_level="warning", ws="none", access_log=False,
                                timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> FakeLLMServer:
        self._thread.start()
        try:
            wait_until(self._started, "the fake LLM server to start", timeout_s=_START_DEADLINE_S, interval_s=0.005)
        except BaseException:
            self.close()
            raise
        return self

    def _started(self) -> bool:
        if not self._server.started and not self._thread.is_alive():
            raise AssertionError("the fake LLM server's thread ended before it started")
        return self._server.started

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=_START_DEADLINE_S)
        self._sock.close()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _serve_forever(port_file: str, words: int, token_delay_s: float, native: str = "") -> None:
    """`python -m tests.fakes.llm PORT_FILE [WORDS [TOKEN_DELAY_S [NATIVE]]]`: serve until killed; port to
    PORT_FILE. NATIVE: comma-separated dialects served natively (see `FakeLLM.native`)."""
    import pathlib
    import threading as _threading

    app = FakeLLM(script=[Reply(content=" ".join(f"w{i}" for i in range(words)), token_delay_s=token_delay_s)],
                  native=frozenset(filter(None, native.split(","))))
    with FakeLLMServer(app) as server:
        pathlib.Path(port_file).write_text(str(server.port))
        _threading.Event().wait()


if __name__ == "__main__":
    import sys

    argv = sys.argv[1:]
    _serve_forever(argv[0], int(argv[1]) if len(argv) > 1 else 20, float(argv[2]) if len(argv) > 2 else 0.0,
                   argv[3] if len(argv) > 3 else "")
