"""The three kinds of relayed call, and `relay_call`, which picks one for a request and hands it to `exchange`.

- chat completions, relayed as they are (rewritten by `llm.rewrite`: model, caps, logprobs), answered as the
  upstream answered;
- a dialect translated: the request to chat completions (`Dialect.to_chat`), the answer back
  (`Dialect.response` / `Dialect.stream`), errors in the dialect's shape; the turn is read from the chat side;
- a dialect passed through to an upstream that serves it itself (`Upstream.native_dialects`): the agent's body
  goes upstream as it wrote it with the rollout's rules applied (`Dialect.native`: model, `max_tokens_cap`, the
  server-held key in the dialect's header; never the relay token); the answer, errors included, comes back byte
  for byte (streams chunk by chunk); the turn is read back from the dialect (`Dialect.read` / `recorder`), its
  prompt from the request's chat translation, so it looks like any other turn. What the relay adds for chat
  completions does not apply: logprobs and token ids (the training trace keeps such turns as context, with a
  note) and the endpoint's disable-thinking body (chat-template specific).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

from coding_agent_env.llm.call import RelayedCall
from coding_agent_env.llm.dialects import Dialect, DialectError, Route, StreamTranslator
from coding_agent_env.llm.exchange import Answer, UpstreamBadResponseError, UpstreamRefusal, exchange
from coding_agent_env.llm.lease import Lease
from coding_agent_env.llm.inbound import error_in, parse_json_object
from coding_agent_env.llm.sse import chunks_of
from coding_agent_env.settings import Settings

__all__ = ["relay_call"]

_DONE = "[DONE]"


async def relay_call(
    request: web.Request, lease: Lease, route: Route | None, body: dict[str, Any], session: aiohttp.ClientSession,
    settings: Settings,
) -> web.StreamResponse:
    """Relay one call for `lease` and return the agent's response; records one turn for every call that goes
    upstream. `route` is the dialect the agent spoke (None: chat completions), `body` its parsed request."""
    if route is None:
        call = RelayedCall(lease, body, settings)
        return await exchange(request, call, session, lease.upstream.chat_url, call.body, call.headers(),
                              _Chat(call))
    dialect = route.dialect
    native = dialect.name in lease.upstream.native_dialects
    try:
        chat = dialect.to_chat(body, route)
    except DialectError as exc:
        if not native:
            return error_in(dialect, 400, str(exc), "invalid_request_error")
        chat = {}  # the upstream takes what the translation cannot (images, say): no prompt recorded
    if native:
        call = RelayedCall(lease, chat, settings, passthrough=dialect.name)
        outbound = dialect.native(route, request.query, body, lease.upstream, request.headers)
        call.stream = outbound.stream
        return await exchange(request, call, session, outbound.url, outbound.body, outbound.headers,
                              _Native(call, dialect))
    call = RelayedCall(lease, chat, settings)
    return await exchange(request, call, session, lease.upstream.chat_url, call.body, call.headers(),
                          _Translated(call, dialect))


# -- chat completions, as they are -----------------------------------------------------------------------------


class _Chat(Answer):
    def __init__(self, call: RelayedCall) -> None:
        self._call = call

    def error(self, status: int, message: str, kind: str) -> web.Response:
        return error_in(None, status, message, kind)

    def streams(self, upstream: aiohttp.ClientResponse) -> bool:
        return self._call.stream

    def refused(self, refusal: UpstreamRefusal) -> web.Response:
        return web.Response(status=refusal.status, text=refusal.text, content_type=refusal.content_type)

    def whole(self, raw: bytes, content_type: str) -> web.Response:
        self._record(raw)
        return web.Response(body=raw, content_type="application/json")

    def _record(self, raw: bytes) -> dict[str, Any]:
        parsed = parse_json_object(raw)
        if parsed is None:
            raise UpstreamBadResponseError("upstream response is not a JSON object")
        self._call.assembler.add_response(parsed)
        return parsed

    def stream(self) -> _ChatStream:
        return _ChatStream(self._call, None, _chat_stream_error)

    def replay(self, completion: dict[str, Any]) -> bytes:
        events = [f"data: {json.dumps(chunk)}\n\n".encode() for chunk in chunks_of(completion)]
        return b"".join(events) + b"data: [DONE]\n\n"


def _chat_stream_error(message: str) -> bytes:
    event = {"error": {"message": message, "type": "upstream_stream_error", "code": 502}}
    return f"data: {json.dumps(event)}\n\n".encode()


class _ChatStream:
    """A chat-completions stream, passed on as it is, or translated chunk by chunk into a dialect's events."""

    missing_end = "upstream stream ended without [DONE]"

    def __init__(self, call: RelayedCall, translator: StreamTranslator | None, failed: Callable[[str], bytes]) -> None:
        self._call = call
        self._translator = translator
        self._failed = failed
        self._done = False
        self.raw = translator is None

    def feed(self, data: str) -> bytes:
        if data.strip() == _DONE:
            self._done = True
        elif (parsed := parse_json_object(data)) is not None:
            self._call.assembler.add_chunk(parsed)
            if self._translator is not None:
                return self._translator.feed(parsed)
        return b""

    def whole(self) -> bool:
        return self._done

    def finish(self) -> bytes:
        return self._translator.finish() if self._translator is not None else b""

    def failed(self, message: str) -> bytes:
        return self._failed(message)

    def record(self) -> None:
        """Each chunk was recorded as it came."""


# -- a dialect over chat completions ---------------------------------------------------------------------------


class _Translated(_Chat):
    def __init__(self, call: RelayedCall, dialect: Dialect) -> None:
        super().__init__(call)
        self._dialect = dialect

    def error(self, status: int, message: str, kind: str) -> web.Response:
        return error_in(self._dialect, status, message, kind)

    def refused(self, refusal: UpstreamRefusal) -> web.Response:
        message = refusal.detail.get("message") if isinstance(refusal.detail, dict) else None
        return self.error(refusal.status, str(message or refusal.capped), "upstream_error")

    def whole(self, raw: bytes, content_type: str) -> web.Response:
        answer = self._dialect.response(self._record(raw), self._call.body.get("model"))
        return web.Response(text=json.dumps(answer), content_type="application/json")

    def stream(self) -> _ChatStream:
        dialect = self._dialect
        return _ChatStream(self._call, dialect.stream(self._call.body.get("model")),
                           lambda message: dialect.stream_error(dialect.error_body(502, message)))

    def replay(self, completion: dict[str, Any]) -> bytes:
        translator = self._dialect.stream(self._call.body.get("model"))
        return b"".join(translator.feed(chunk) for chunk in chunks_of(completion)) + translator.finish()


# -- a dialect passed through ----------------------------------------------------------------------------------


class _Native(Answer):
    def __init__(self, call: RelayedCall, dialect: Dialect) -> None:
        self._call = call
        self._dialect = dialect

    def error(self, status: int, message: str, kind: str) -> web.Response:
        return error_in(self._dialect, status, message, kind)

    def streams(self, upstream: aiohttp.ClientResponse) -> bool:
        return upstream.content_type == "text/event-stream"

    def refused(self, refusal: UpstreamRefusal) -> web.Response:
        """The upstream's own error, in the agent's dialect already: passed on (redacted, capped)."""
        return web.Response(status=refusal.status, text=refusal.capped, content_type=refusal.content_type)

    def whole(self, raw: bytes, content_type: str) -> web.Response:
        try:
            parsed = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise UpstreamBadResponseError("upstream response is not JSON") from exc
        if isinstance(parsed, list):  # Google's streamed answer without alt=sse: a JSON array of chunks
            reader = self._dialect.recorder()
            for chunk in parsed:
                reader.feed(chunk)
            self._call.assembler.add_response(reader.completion())
        else:
            self._call.assembler.add_response(self._dialect.read(parsed))
        return web.Response(body=raw, content_type=content_type)

    def stream(self) -> _NativeStream:
        return _NativeStream(self._call, self._dialect)


class _NativeStream:
    """A dialect's stream passed on as it is, read back on the side."""

    raw = True
    missing_end = "upstream stream ended before its last event"

    def __init__(self, call: RelayedCall, dialect: Dialect) -> None:
        self._call = call
        self._dialect = dialect
        self._reader = dialect.recorder()
        self._ended = False

    def feed(self, data: str) -> bytes:
        event = parse_json_object(data)
        if event is not None:
            self._reader.feed(event)
            self._ended = self._ended or self._dialect.ends(event)
        return b""

    def whole(self) -> bool:
        return self._ended

    def finish(self) -> bytes:
        return b""

    def failed(self, message: str) -> bytes:
        return self._dialect.stream_error(self._dialect.error_body(502, message))

    def record(self) -> None:
        self._call.assembler.add_response(self._reader.completion())
