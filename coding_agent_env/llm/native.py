"""A call in an agent dialect passed through to an upstream that serves that dialect itself (the endpoint's or
the request's `native_dialects`), instead of translated to chat completions.

The agent's body goes upstream as it wrote it, with the rollout's rules applied: the upstream's model (in the
body, or in a Google path), `max_tokens_cap` on the dialect's own limit field, the server-held key in the
dialect's own header (Anthropic `x-api-key` with the agent's `anthropic-version` / `anthropic-beta`, Responses
`Authorization: Bearer`, Google `x-goog-api-key`); the relay token is never forwarded. The URL is the upstream's
base URL followed by the dialect's resource: `/messages`, `/responses`, `/models/MODEL:METHOD` (Google's `alt`
query kept). The answer, errors included, comes back byte for byte (streams chunk by chunk as they arrive);
the turn is read back from the dialect on the side (`dialects.record`), its prompt from the request's chat
translation, so it looks like any other turn. What the relay adds for chat completions does not apply here:
logprobs and token ids (the dialects have none: the training trace keeps such turns as context, with a note)
and the endpoint's disable-thinking body (chat-template specific).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp
from aiohttp import web

from coding_agent_env.llm.dialects import Dialect, google, record
from coding_agent_env.llm.forward import RelayedCall, error_for, exchange
from coding_agent_env.llm.lease import Lease
from coding_agent_env.llm.sse import SseParser
from coding_agent_env.llm.upstream import Upstream
from coding_agent_env.llm.wire import parse_json_object
from coding_agent_env.settings import Settings
from coding_agent_env.streams import read_at_most

__all__ = ["NativeRequest", "native_request", "relay_native"]

_ANTHROPIC_VERSION = "2023-06-01"
_LAST_EVENT = {"anthropic": frozenset({"message_stop"}),
               "responses": frozenset({"response.completed", "response.incomplete", "response.failed"})}
"""The event types that end a whole stream, for the dialects that name one."""


def _ends(dialect: str, event: dict[str, Any]) -> bool:
    """Whether `event` is the last of a whole streamed answer (a Google stream's last chunk has a finishReason)."""
    if dialect == "google":
        candidates = event.get("candidates")
        return isinstance(candidates, list) and any(isinstance(c, dict) and c.get("finishReason") for c in candidates)
    return event.get("type") in _LAST_EVENT[dialect]


@dataclass(frozen=True)
class NativeRequest:
    url: str
    headers: dict[str, str]
    body: dict[str, Any]
    stream: bool


def native_request(
    dialect: str, path: str, query: Mapping[str, str], body: dict[str, Any], upstream: Upstream,
    agent_headers: Mapping[str, str],
) -> NativeRequest:
    """What goes upstream for an agent's call (`path` as the relay received it, already known to be `dialect`'s)."""
    base = upstream.base_url.rstrip("/")
    out = dict(body)
    secret = upstream.secret()
    headers = {"Content-Type": "application/json"}
    cap = upstream.max_tokens_cap
    if dialect == "google":
        found = google.parse_path(path)
        assert found is not None, path
        model, stream = found
        method = "streamGenerateContent" if stream else "generateContent"
        url = f"{base}/models/{quote(upstream.model or model, safe='/-_.')}:{method}"
        if query.get("alt"):
            url += f"?alt={quote(query['alt'])}"
        if cap is not None:
            config = dict(out["generationConfig"]) if isinstance(out.get("generationConfig"), dict) else {}
            config["maxOutputTokens"] = _capped(config.get("maxOutputTokens"), cap)
            out["generationConfig"] = config
        if secret is not None:
            headers["x-goog-api-key"] = secret
        return NativeRequest(url, headers, out, stream)
    if upstream.model is not None:
        out["model"] = upstream.model
    if dialect == "anthropic":
        url = f"{base}/messages"
        if cap is not None:
            out["max_tokens"] = _capped(out.get("max_tokens"), cap)
        headers["anthropic-version"] = agent_headers.get("anthropic-version") or _ANTHROPIC_VERSION
        if agent_headers.get("anthropic-beta"):
            headers["anthropic-beta"] = agent_headers["anthropic-beta"]
        if secret is not None:
            headers["x-api-key"] = secret
    elif dialect == "responses":
        url = f"{base}/responses"
        if cap is not None:
            out["max_output_tokens"] = _capped(out.get("max_output_tokens"), cap)
        if secret is not None:
            headers["Authorization"] = f"Bearer {secret}"
    else:
        raise ValueError(f"no native pass-through for dialect {dialect!r}")
    return NativeRequest(url, headers, out, out.get("stream") is True)


def _capped(value: Any, cap: int) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= cap:
        return value
    return cap


async def relay_native(
    request: web.Request, lease: Lease, dialect: Dialect, body: dict[str, Any], chat: dict[str, Any],
    session: aiohttp.ClientSession, settings: Settings,
) -> web.StreamResponse:
    """Pass one call through for `lease`; records one turn in every case (as `forward.relay_call` does). `chat`
    is the call's chat translation, for the turn's prompt ({} when it has none)."""
    call = RelayedCall(lease, chat, settings)
    call.dialect, call.passthrough = dialect, dialect.name
    native = native_request(dialect.name, request.path, request.query, body, lease.upstream, request.headers)
    call.stream = native.stream

    async def answer(upstream: aiohttp.ClientResponse) -> web.StreamResponse:
        if upstream.status != 200:
            return await _upstream_error(call, upstream)
        if upstream.content_type == "text/event-stream":
            return await _stream(request, call, upstream)
        return await _whole(call, upstream)

    return await exchange(call, session, native.url, native.body, native.headers, answer)


async def _upstream_error(call: RelayedCall, upstream: aiohttp.ClientResponse) -> web.Response:
    """The upstream's own error, in its own dialect already: passed on (redacted, capped) and recorded."""
    cap = call.settings.relay_max_error_chars
    text = call.redact((await read_at_most(upstream.content, cap * 4)).decode("utf-8", "replace"))[:cap]
    call.error = f"upstream returned {upstream.status}: {text}"
    parsed = parse_json_object(text.encode())
    detail = parsed.get("error") if parsed is not None else None
    call.upstream_error = detail if isinstance(detail, dict) else {"message": text}
    return web.Response(status=upstream.status, text=text, content_type=upstream.content_type or "application/json")


async def _whole(call: RelayedCall, upstream: aiohttp.ClientResponse) -> web.Response:
    limit = call.settings.relay_max_response_bytes
    raw = await read_at_most(upstream.content, limit + 1)
    if len(raw) > limit:
        call.error = f"upstream response larger than {limit} bytes"
        return error_for(call, 502, call.error, "upstream_response_too_large")
    try:
        parsed = json.loads(raw)
    except ValueError:
        call.error = "upstream response is not JSON"
        return error_for(call, 502, call.error, "upstream_bad_response")
    assert call.passthrough is not None
    if isinstance(parsed, list):  # Google's streamed answer without alt=sse: a JSON array of chunks
        reader = record.recorder(call.passthrough)
        for chunk in parsed:
            reader.feed(chunk)
        call.assembler.add_response(reader.completion())
    else:
        call.assembler.add_response(record.whole(call.passthrough, parsed))
    return web.Response(body=raw, content_type=upstream.content_type or "application/json")


async def _stream(request: web.Request, call: RelayedCall, upstream: aiohttp.ClientResponse) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    assert call.passthrough is not None and call.dialect is not None
    parser = SseParser(call.settings.relay_max_response_bytes)
    reader = record.recorder(call.passthrough)
    ended = False
    try:
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
            for data in parser.feed(chunk):
                event = parse_json_object(data)
                if event is not None:
                    reader.feed(event)
                    ended = ended or _ends(call.passthrough, event)
    except ConnectionResetError:
        # An agent may hang up once it has the dialect's last event (Codex does): the answer was whole.
        if not ended:
            call.error = "client disconnected"
        return response
    except TimeoutError:
        call.error = "upstream timed out mid-stream"
    except aiohttp.ClientError as exc:
        call.error = call.redact(f"upstream stream broke: {type(exc).__name__}")
    else:
        if not ended:
            call.error = "upstream stream ended before its last event"
    finally:
        call.assembler.add_response(reader.completion())
    try:
        if call.error is not None:
            await response.write(call.dialect.stream_error(call.dialect.error_body(502, call.error)))
        await response.write_eof()
    except ConnectionResetError:
        if not ended:
            call.error = call.error or "client disconnected"
    return response
