"""One relayed chat-completion call: forward upstream, pass the answer back, record the turn.

Streams are passed through chunk by chunk as they arrive (no buffering); the turn is assembled on the
side from the same bytes. Whatever happens (upstream 4xx/5xx, timeout, unreachable upstream, client
disconnect, lease closed), exactly one `Turn` is recorded and the relay keeps serving.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from coding_agent_env.llm.capture import TurnAssembler
from coding_agent_env.llm.dialects import Dialect
from coding_agent_env.llm.lease import Lease, PromptDelta
from coding_agent_env.llm.rewrite import rewrite_request
from coding_agent_env.llm.sse import SseParser
from coding_agent_env.llm.wire import error_response, parse_json_object
from coding_agent_env.models import Turn
from coding_agent_env.settings import Settings
from coding_agent_env.streams import read_at_most

__all__ = ["RelayedCall", "error_for", "exchange", "relay_call"]

_DONE = "[DONE]"


class RelayedCall:
    """One call in flight and what its turn is made of. `passthrough` names the dialect of a call sent upstream
    as the agent wrote it (`llm.native`); otherwise `body` is the chat-completions request sent."""

    def __init__(self, lease: Lease, body: dict[str, Any], settings: Settings) -> None:
        self.lease = lease
        self.settings = settings
        self.prompt: PromptDelta = lease.begin(body.get("messages"), body.get("tools"))
        self.body = rewrite_request(body, lease.upstream)
        self.stream = self.body.get("stream") is True
        self.assembler = TurnAssembler()
        self.status: int | None = None
        self.dialect: Dialect | None = None
        self.error: str | None = None
        self.upstream_error: dict[str, Any] | None = None
        self.passthrough: str | None = None
        self.timestamp = time.time()
        self.started = time.monotonic()
        self.ended: float | None = None
        self._secret = lease.upstream.secret()

    def redact(self, text: str) -> str:
        if self._secret and self._secret in text:
            text = text.replace(self._secret, "[REDACTED]")
        return text

    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream" if self.stream else "application/json"}
        if self._secret is not None:
            headers["Authorization"] = f"Bearer {self._secret}"
        return headers

    def turn(self) -> Turn:
        a = self.assembler
        message = a.message()
        if self._secret and message.content and self._secret in message.content:
            message = message.model_copy(update={"content": self.redact(message.content)})
        return Turn(
            turn=self.prompt.index,
            stream=self.stream,
            request_messages_reused=self.prompt.reused,
            request_messages=self.prompt.messages,
            request_tools=self.prompt.tools,
            request_tools_reused=self.prompt.tools_reused,
            model=a.model,
            message=message,
            finish_reason=a.finish_reason,
            usage=a.usage,
            latency_s=round((self.ended or time.monotonic()) - self.started, 6),
            timestamp=round(self.timestamp, 6),
            upstream_status=self.status,
            upstream_error=self.upstream_error or ({"message": self.error} if self.error else None),
            error=self.error,
            passthrough=self.passthrough,  # type: ignore[arg-type]
            prompt_token_ids=a.prompt_token_ids,
            completion_token_ids=a.sampled_ids(),
            completion_tokens=a.tokens or [],
            per_token_logps=a.logprobs or [],
        )


async def relay_call(
    request: web.Request, lease: Lease, body: dict[str, Any], session: aiohttp.ClientSession, settings: Settings,
    dialect: Dialect | None = None,
) -> web.StreamResponse:
    """Forward one call for `lease` and return the agent's response; records one turn in every case. `body` is a
    chat-completions request; with a `dialect` the agent spoke that dialect (its request already translated) and
    gets its answer, errors included, in it (the turn is recorded from the chat side either way)."""
    call = RelayedCall(lease, body, settings)
    call.dialect = dialect

    async def answer(upstream: aiohttp.ClientResponse) -> web.StreamResponse:
        if upstream.status != 200:
            return await _upstream_error(call, upstream)
        if call.stream:
            return await _stream(request, call, upstream)
        return await _whole(call, upstream)

    return await exchange(call, session, lease.upstream.chat_url, call.body, call.headers(), answer)


async def exchange(
    call: RelayedCall, session: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str],
    answer: Callable[[aiohttp.ClientResponse], Awaitable[web.StreamResponse]],
) -> web.StreamResponse:
    """POST `body` to `url` for `call` and have `answer` make the agent's response of the upstream's. A timeout or
    an unreachable upstream becomes an error in the agent's dialect; the call's turn is recorded whatever
    happens (cancellation included)."""
    settings = call.settings
    timeout = aiohttp.ClientTimeout(
        total=None, connect=settings.relay_connect_timeout_s, sock_read=settings.relay_read_timeout_s
    )
    try:
        async with session.post(
            url,
            # A BytesIO body: aiohttp warns (ResourceWarning) on large raw `bytes` bodies, and long agent
            # conversations pass 1 MiB.
            data=io.BytesIO(json.dumps(body, separators=(",", ":")).encode()),
            headers=headers,
            timeout=timeout,
            allow_redirects=False,
        ) as upstream:
            call.status = upstream.status
            return await answer(upstream)
    except TimeoutError:
        call.error = "upstream timed out"
        return error_for(call, 504, call.error, "upstream_timeout")
    except aiohttp.ClientError as exc:
        call.error = call.redact(f"upstream unreachable: {type(exc).__name__}")
        return error_for(call, 502, call.error, "upstream_unreachable")
    except BaseException:
        call.error = call.error or ("lease closed" if call.lease.closed else "call cancelled")
        raise
    finally:
        call.ended = time.monotonic()
        call.body = {}  # the turn keeps only the prompt delta: never the whole request
        call.lease.record(call)


async def _upstream_error(call: RelayedCall, upstream: aiohttp.ClientResponse) -> web.Response:
    cap = call.settings.relay_max_error_chars
    raw = await read_at_most(upstream.content, cap * 4)
    text = call.redact(raw.decode("utf-8", "replace"))
    call.error = f"upstream returned {upstream.status}: {text[:cap]}"
    parsed = parse_json_object(text[:cap].encode())
    detail = parsed.get("error") if parsed is not None else None
    call.upstream_error = detail if isinstance(detail, dict) else {"message": text[:cap]}
    if call.dialect is not None:
        message = detail.get("message") if isinstance(detail, dict) else None
        return error_for(call, upstream.status, str(message or text[:cap]), "upstream_error")
    return web.Response(status=upstream.status, text=text, content_type=upstream.content_type or "application/json")


def error_for(call: RelayedCall, status: int, message: str, kind: str) -> web.Response:
    """An error in the agent's dialect."""
    if call.dialect is not None:
        return web.Response(status=status, text=json.dumps(call.dialect.error_body(status, message)),
                            content_type="application/json")
    return error_response(status, message, kind)


async def _whole(call: RelayedCall, upstream: aiohttp.ClientResponse) -> web.Response:
    limit = call.settings.relay_max_response_bytes
    raw = await read_at_most(upstream.content, limit + 1)
    if len(raw) > limit:
        call.error = f"upstream response larger than {limit} bytes"
        return error_for(call, 502, call.error, "upstream_response_too_large")
    parsed = parse_json_object(raw)
    if parsed is None:
        call.error = "upstream response is not a JSON object"
        return error_for(call, 502, call.error, "upstream_bad_response")
    call.assembler.add_response(parsed)
    if call.dialect is not None:
        answer = call.dialect.response(parsed, call.body.get("model"))
        return web.Response(text=json.dumps(answer), content_type="application/json")
    return web.Response(body=raw, content_type="application/json")


async def _stream(request: web.Request, call: RelayedCall, upstream: aiohttp.ClientResponse) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    parser = SseParser(call.settings.relay_max_response_bytes)
    dialect = call.dialect
    translator = dialect.stream(call.body.get("model")) if dialect is not None else None
    done = False
    try:
        async for chunk in upstream.content.iter_any():
            if translator is None:
                await response.write(chunk)
            for data in parser.feed(chunk):
                if data.strip() == _DONE:
                    done = True
                elif (parsed := parse_json_object(data)) is not None:
                    call.assembler.add_chunk(parsed)
                    if translator is not None and (events := translator.feed(parsed)):
                        await response.write(events)
    except ConnectionResetError:
        # A client may hang up once it has read [DONE], passed on as it came: the answer was whole.
        if not (done and translator is None):
            call.error = "client disconnected"
        return response
    except TimeoutError:
        call.error = "upstream timed out mid-stream"
    except aiohttp.ClientError as exc:
        call.error = call.redact(f"upstream stream broke: {type(exc).__name__}")
    else:
        if not done:
            call.error = "upstream stream ended without [DONE]"
    delivered = False
    try:
        if call.error is not None and dialect is not None:
            await response.write(dialect.stream_error(dialect.error_body(502, call.error)))
        elif call.error is not None:
            # Tell the client in-band (the openai client raises on an `error` event) instead of ending cleanly.
            event = {"error": {"message": call.error, "type": "upstream_stream_error", "code": 502}}
            await response.write(f"data: {json.dumps(event)}\n\n".encode())
        elif translator is not None:
            await response.write(translator.finish())
        delivered = call.error is None  # the whole answer is written: a hang-up from here loses nothing
        await response.write_eof()
    except ConnectionResetError:
        if not delivered:
            call.error = call.error or "client disconnected"
    return response
