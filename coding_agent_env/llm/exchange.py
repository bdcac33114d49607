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

What the relay adds never breaks an agent: an error answer refusing it (`RelayedCall.reroute`) sends the call
again in a form the engine accepts, before the agent is told anything; a streamed call the engine refuses
streamed is sent not streamed (`RelayedCall.buffered`) and its answer streamed to the agent in its dialect
(`Answer.replay`), with SSE comment keep-alives while the engine works. An engine that returns no prompt ids but
can tokenize (llama.cpp) is asked for those of the exact request sent, once the answer is in (`_prompt_ids`).
"""

from __future__ import annotations

import asyncio
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

KEEPALIVE_S = 5.0
"""While a buffered call waits for its engine, an SSE comment goes to the agent this often (the first one starts
its stream), so its client's read timeout does not fire."""
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


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

    def replay(self, completion: dict[str, Any]) -> bytes:
        """A whole chat completion (already recorded) as the stream the agent asked for, ended."""
        raise NotImplementedError


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
    started: list[web.StreamResponse] = []  # a buffered call's stream to the agent, once begun
    try:
        while True:
            if call.buffered:
                response = await _buffered(request, call, session, url, body, headers, answer, timeout, started)
            else:
                response = await _direct(request, call, session, url, body, headers, answer, timeout)
            if response is not None:
                return response
            body, headers = call.body, call.headers()  # rerouted: the same call, in a form the upstream accepts
    except UpstreamError as exc:
        call.error = str(exc)
        if started:
            return await _fail_in_band(started[0], answer, call)
        return answer.error(exc.status, call.error, exc.kind)
    except BaseException:
        call.error = call.error or ("lease closed" if call.lease.closed else "call cancelled")
        raise
    finally:
        call.done()


def _payload(body: dict[str, Any]) -> io.BytesIO:
    # A BytesIO body: aiohttp warns (ResourceWarning) on large raw `bytes` bodies, and long agent conversations
    # pass 1 MiB.
    return io.BytesIO(json.dumps(body, separators=(",", ":")).encode())


async def _direct(
    request: web.Request, call: RelayedCall, session: aiohttp.ClientSession, url: str, body: dict[str, Any],
    headers: dict[str, str], answer: Answer, timeout: aiohttp.ClientTimeout,
) -> web.StreamResponse | None:
    """The call as it goes: the agent's response, or None when it is to go again (rerouted)."""
    async with _mapped(call, mid_stream=False), session.post(
        url, data=_payload(body), headers=headers, timeout=timeout, allow_redirects=False
    ) as upstream:
        call.answered(upstream.status, upstream.headers)
        if upstream.status != 200:
            refusal = await _refusal(call, upstream)
            if call.reroute(refusal.status, _message(refusal)):
                return None
            return answer.refused(refusal)
        if answer.streams(upstream):
            try:
                return await _stream(request, call, upstream, answer.stream(), session, timeout)
            finally:
                # Never back into the pool: llama-server closes the connection after a streamed answer while its
                # reply says keep-alive, and a call sent on it next would fail (a 502, or prompt ids lost).
                upstream.close()
        response = await _whole(call, upstream, answer)
    await _prompt_ids(call, session, timeout)
    return response


async def _post_whole(
    call: RelayedCall, session: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str],
    timeout: aiohttp.ClientTimeout,
) -> bytes | UpstreamRefusal:
    async with _mapped(call, mid_stream=False), session.post(
        url, data=_payload(body), headers=headers, timeout=timeout, allow_redirects=False
    ) as upstream:
        call.answered(upstream.status, upstream.headers)
        if upstream.status != 200:
            return await _refusal(call, upstream)
        limit = call.settings.relay_max_response_bytes
        raw = await read_at_most(upstream.content, limit + 1)
        if len(raw) > limit:
            raise UpstreamResponseTooLargeError(f"upstream response larger than {limit} bytes")
        return raw


async def _buffered(
    request: web.Request, call: RelayedCall, session: aiohttp.ClientSession, url: str, body: dict[str, Any],
    headers: dict[str, str], answer: Answer, timeout: aiohttp.ClientTimeout, started: list[web.StreamResponse],
) -> web.StreamResponse | None:
    """A streamed call sent not streamed: keep-alives to the agent while the engine works, then its answer as
    the agent's stream. None when the call is to go again (rerouted)."""
    post = asyncio.ensure_future(_post_whole(call, session, url, body, headers, timeout))
    try:
        while True:
            await asyncio.wait({post}, timeout=KEEPALIVE_S)
            if post.done():
                break
            if not started:
                response = web.StreamResponse(headers=_SSE_HEADERS)
                await response.prepare(request)
                started.append(response)
            await started[0].write(b": keep-alive\n\n")
    except ConnectionResetError:
        call.error = "client disconnected"
        return started[0] if started else web.Response(status=499)
    finally:
        if not post.done():
            post.cancel()
            await asyncio.gather(post, return_exceptions=True)
    result = post.result()  # an UpstreamError is the caller's
    if isinstance(result, UpstreamRefusal):
        if call.reroute(result.status, _message(result)):
            return None
        if not started:
            return answer.refused(result)
        return await _fail_in_band(started[0], answer, call)
    parsed = parse_json_object(result)
    if parsed is None:
        raise UpstreamBadResponseError("upstream response is not a JSON object")
    call.assembler.add_response(parsed)
    events = answer.replay(parsed)
    await _prompt_ids(call, session, timeout)  # before the agent has its answer (and may end, closing the lease)
    try:
        if not started:
            response = web.StreamResponse(headers=_SSE_HEADERS)
            started.append(response)
            await response.prepare(request)
        await started[0].write(events)
        await started[0].write_eof()
    except ConnectionResetError:
        call.error = "client disconnected"
    return started[0]


async def _fail_in_band(response: web.StreamResponse, answer: Answer, call: RelayedCall) -> web.StreamResponse:
    """An error for an agent whose stream has begun (keep-alives): the dialect's in-band error event."""
    try:
        await response.write(answer.stream().failed(call.error or "upstream error"))
        await response.write_eof()
    except ConnectionResetError:
        pass
    return response


def _message(refusal: UpstreamRefusal) -> str:
    detail = refusal.detail
    message = detail.get("message") if isinstance(detail, dict) else None
    return message if isinstance(message, str) else refusal.capped


async def _prompt_ids(call: RelayedCall, session: aiohttp.ClientSession, timeout: aiohttp.ClientTimeout) -> None:
    """Prompt ids the engine did not return, obtained from it for the exact request sent (llama.cpp: its chat
    template, then its tokenizer); kept only when as many as the answer's `usage.prompt_tokens`."""
    engine = call.assembler.engine
    if not call.transparent or call.error is not None or call.assembler.prompt_token_ids is not None or not call.body:
        return
    asked = engine.prompt_ids_request(call.body)
    if asked is None:
        return
    source = asked.source
    root = call.lease.upstream.base_url.rstrip("/")
    root = root[:-3] if root.endswith("/v1") else root
    body = {k: v for k, v in call.body.items() if k not in ("stream", "stream_options")}
    headers = {k: v for k, v in call.headers().items() if k != "Accept"}

    async def ask(path: str, payload: dict[str, Any], key: str) -> Any:
        # Both are reads: one broken pooled connection (llama-server may close one it said it would keep) is
        # tried again once, on a fresh one.
        for attempt in (1, 2):
            try:
                async with session.post(root + path, data=_payload(payload), headers=headers, timeout=timeout,
                                        allow_redirects=False) as reply:
                    return (await reply.json(content_type=None)).get(key) if reply.status == 200 else None
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
                if attempt == 2:
                    raise
        return None

    try:
        prompt = await ask("/apply-template", body, "prompt")
        if not isinstance(prompt, str):
            call.prompt_ids_source = f"{source}: no prompt from /apply-template"
            return
        tokens = await ask("/tokenize", {"content": prompt, "add_special": True, "parse_special": True}, "tokens")
    except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError) as exc:
        call.prompt_ids_source = f"{source}: failed ({type(exc).__name__})"
        return
    if not isinstance(tokens, list) or not all(type(t) is int and t >= 0 for t in tokens):
        call.prompt_ids_source = f"{source}: no tokens from /tokenize"
        return
    usage = call.assembler.usage
    if usage is not None and usage.prompt_tokens is not None and usage.prompt_tokens != len(tokens):
        call.prompt_ids_source = f"{source}: {len(tokens)} ids for {usage.prompt_tokens} prompt tokens, dropped"
        return
    call.assembler.prompt_token_ids = tokens
    call.prompt_ids_source = source


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
    request: web.Request, call: RelayedCall, upstream: aiohttp.ClientResponse, side: StreamSide,
    session: aiohttp.ClientSession, timeout: aiohttp.ClientTimeout,
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
    await _prompt_ids(call, session, timeout)  # before the agent's stream ends (it may end the rollout then)
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
