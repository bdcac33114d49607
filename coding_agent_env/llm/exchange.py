"""The one place a relayed call meets its upstream: POST, read the answer, map what goes wrong, record the turn.

Every call the relay forwards, whatever the agent's dialect and whether it is translated or passed through, goes
through `exchange`. What differs between kinds of call is an `Answer`, the strategy that makes the agent's
response of the upstream's (and its `StreamSide` for a streamed one): `llm.answers` has the three kinds.

Failures are mapped here and only here (as httpx does at its transport): aiohttp's timeouts and client errors
become `UpstreamError`s, each with the status and kind the agent is told; an answer too large or not an answer
is one too. Before anything is streamed the agent gets an error response in its dialect; mid-stream it gets the
dialect's in-band error event. Streams are passed on chunk by chunk as they arrive (no buffering); the turn is
assembled on the side from the same bytes. Whatever happens (upstream 4xx/5xx, timeout, unreachable upstream,
client disconnect, lease closed, cancellation), exactly one `Turn` is recorded and the relay keeps serving.
"""

from __future__ import annotations

import io
import json
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
from aiohttp import web

from coding_agent_env.llm.call import RelayedCall
from coding_agent_env.llm.sse import SseParser
from coding_agent_env.llm.inbound import parse_json_object
from coding_agent_env.streams import read_at_most

__all__ = [
    "Answer",
    "StreamSide",
    "UpstreamBadResponseError",
    "UpstreamError",
    "UpstreamRefusal",
    "UpstreamResponseTooLargeError",
    "UpstreamTimeoutError",
    "UpstreamUnreachableError",
    "exchange",
]


class UpstreamError(Exception):
    """The upstream's side of a call failed. The message is what the turn records and the agent is told (the key
    redacted); `status` and `kind` are the relay's error for it."""

    status = 502
    kind = "upstream_error"


class UpstreamTimeoutError(UpstreamError):
    status = 504
    kind = "upstream_timeout"


class UpstreamUnreachableError(UpstreamError):
    """The connection failed or broke (before or during the answer)."""

    kind = "upstream_unreachable"


class UpstreamResponseTooLargeError(UpstreamError):
    kind = "upstream_response_too_large"


class UpstreamBadResponseError(UpstreamError):
    """A whole answer that is not one in the expected dialect."""

    kind = "upstream_bad_response"


@dataclass(frozen=True)
class UpstreamRefusal:
    """An upstream's non-200 answer, read (up to 4x `relay_max_error_chars`) and redacted."""

    status: int
    text: str
    capped: str
    """`text` cut to `relay_max_error_chars`: what the turn records."""
    detail: Any
    """The `error` member of the capped text's JSON, if any."""
    content_type: str


class StreamSide(Protocol):
    """One streamed answer on its way to the agent: fed each SSE `data` payload; records the turn's answer."""

    raw: bool
    """The upstream's bytes go to the agent as they are (else `feed` returns what the agent gets)."""
    missing_end: str
    """The turn's error when the stream ends without its last event."""

    def feed(self, data: str) -> bytes: ...

    def whole(self) -> bool:
        """Whether the upstream's last event (chat's [DONE], a dialect's final event) came."""
        ...

    def finish(self) -> bytes:
        """What the agent gets after a whole answer, to close its stream."""
        ...

    def failed(self, message: str) -> bytes:
        """The in-band error event that ends a broken stream."""
        ...

    def record(self) -> None:
        """The stream is over (whole or not): put what was read into the turn."""
        ...


class Answer(ABC):
    """How the agent's response is made of the upstream's, for one call."""

    @abstractmethod
    def error(self, status: int, message: str, kind: str) -> web.Response:
        """An error the relay makes, in the agent's dialect."""

    @abstractmethod
    def streams(self, upstream: aiohttp.ClientResponse) -> bool:
        """Whether the 200 answer is read as a stream."""

    @abstractmethod
    def refused(self, refusal: UpstreamRefusal) -> web.Response:
        """The agent's response to the upstream's error answer (already recorded)."""

    @abstractmethod
    def whole(self, raw: bytes, content_type: str) -> web.Response:
        """Record a whole answer and make the agent's response; `UpstreamBadResponseError` if it is not one."""

    @abstractmethod
    def stream(self) -> StreamSide:
        """The side of a streamed answer."""


@asynccontextmanager
async def _mapped(call: RelayedCall, *, mid_stream: bool) -> AsyncIterator[None]:
    """aiohttp's failures as `UpstreamError`s: the one place they are translated."""
    try:
        yield
    except Exception as exc:
        if mid_stream and isinstance(exc, ConnectionResetError):
            raise  # the agent hung up while its stream was written (aiohttp's reset error is a ClientError too)
        if isinstance(exc, TimeoutError):
            raise UpstreamTimeoutError("upstream timed out mid-stream" if mid_stream else "upstream timed out") from exc
        if isinstance(exc, aiohttp.ClientError):
            what = "upstream stream broke" if mid_stream else "upstream unreachable"
            raise UpstreamUnreachableError(call.redact(f"{what}: {type(exc).__name__}")) from exc
        raise


async def exchange(
    request: web.Request, call: RelayedCall, session: aiohttp.ClientSession, url: str, body: dict[str, Any],
    headers: dict[str, str], answer: Answer,
) -> web.StreamResponse:
    """POST `body` to `url` for `call` and return the agent's response, made by `answer` of the upstream's. The
    call's turn is recorded whatever happens (cancellation included)."""
    settings = call.settings
    timeout = aiohttp.ClientTimeout(
        total=None, connect=settings.relay_connect_timeout_s, sock_read=settings.relay_read_timeout_s
    )
    # A BytesIO body: aiohttp warns (ResourceWarning) on large raw `bytes` bodies, and long agent conversations
    # pass 1 MiB.
    data = io.BytesIO(json.dumps(body, separators=(",", ":")).encode())
    try:
        async with _mapped(call, mid_stream=False), session.post(
            url, data=data, headers=headers, timeout=timeout, allow_redirects=False
        ) as upstream:
            call.status = upstream.status
            if upstream.status != 200:
                return answer.refused(await _refusal(call, upstream))
            if answer.streams(upstream):
                return await _stream(request, call, upstream, answer.stream())
            return await _whole(call, upstream, answer)
    except UpstreamError as exc:
        call.error = str(exc)
        return answer.error(exc.status, call.error, exc.kind)
    except BaseException:
        call.error = call.error or ("lease closed" if call.lease.closed else "call cancelled")
        raise
    finally:
        call.done()


async def _refusal(call: RelayedCall, upstream: aiohttp.ClientResponse) -> UpstreamRefusal:
    cap = call.settings.relay_max_error_chars
    text = call.redact((await read_at_most(upstream.content, cap * 4)).decode("utf-8", "replace"))
    capped = text[:cap]
    call.error = f"upstream returned {upstream.status}: {capped}"
    parsed = parse_json_object(capped.encode())
    detail = parsed.get("error") if parsed is not None else None
    call.upstream_error = detail if isinstance(detail, dict) else {"message": capped}
    return UpstreamRefusal(upstream.status, text, capped, detail, upstream.content_type or "application/json")


async def _whole(call: RelayedCall, upstream: aiohttp.ClientResponse, answer: Answer) -> web.Response:
    limit = call.settings.relay_max_response_bytes
    raw = await read_at_most(upstream.content, limit + 1)
    if len(raw) > limit:
        raise UpstreamResponseTooLargeError(f"upstream response larger than {limit} bytes")
    return answer.whole(raw, upstream.content_type or "application/json")


async def _stream(
    request: web.Request, call: RelayedCall, upstream: aiohttp.ClientResponse, side: StreamSide
) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    parser = SseParser(call.settings.relay_max_response_bytes)
    try:
        async with _mapped(call, mid_stream=True):
            async for chunk in upstream.content.iter_any():
                if side.raw:
                    await response.write(chunk)
                for data in parser.feed(chunk):
                    if events := side.feed(data):
                        await response.write(events)
    except ConnectionResetError:
        # An agent may hang up once it has read the last event passed on as it came (Codex does on
        # response.completed): the answer was whole. A translated stream is not whole until `finish`.
        if not (side.raw and side.whole()):
            call.error = "client disconnected"
        return response
    except UpstreamError as exc:
        call.error = str(exc)
    else:
        if not side.whole():
            call.error = side.missing_end
    finally:
        side.record()
    delivered = False
    try:
        # Tell the agent in-band (its client raises on the error event) instead of ending cleanly.
        tail = side.failed(call.error) if call.error is not None else side.finish()
        if tail:
            await response.write(tail)
        delivered = call.error is None  # the whole answer is written: a hang-up from here loses nothing
        await response.write_eof()
    except ConnectionResetError:
        if not delivered:
            call.error = call.error or "client disconnected"
    return response
