"""The relay on the server's own port, for remote sandboxes: `/llm/v1/...` (`settings.PUBLIC_RELAY_PATH`).

A cloud sandbox (HF Sandbox, E2B) cannot reach the relay's loopback listener; it reaches the server. This ASGI
app is the relay's door on the server's port (every dialect the relay speaks), guarded only by per-rollout tokens
(bearer, or in a dialect's key header, `x-api-key` / `x-goog-api-key`, as those clients send them): a request
without a live lease's token gets 401 here, before anything is read or forwarded (so nothing reaches the relay's
handler or the upstream); a body over `relay_max_body_bytes` gets 413. Accepted requests are forwarded to the
relay's loopback listener with the headers the relay reads (the dialects' own, `llm.dialects.agent_headers`:
their key headers and those passed through, such as `anthropic-version` and `anthropic-beta`), response streamed
back as it comes (the relay applies its caps, per-token concurrency included, and records the turn). The
upstream key never leaves the server; the token dies with the agent's phase, as on every path.
"""

from __future__ import annotations

import json

import aiohttp
from starlette.types import Receive, Scope, Send

from coding_agent_env.llm.dialects import agent_headers, key_headers
from coding_agent_env.llm.shared import SharedRelay
from coding_agent_env.settings import PUBLIC_RELAY_PATH, Settings

__all__ = ["PublicRelayRoute"]

_FORWARDED = frozenset({"content-type", "accept", "authorization"}) | agent_headers()
_HOP_BY_HOP = frozenset(("connection", "keep-alive", "transfer-encoding", "content-length", "server", "date"))


class PublicRelayRoute:
    """Mounted at the prefix of `PUBLIC_RELAY_PATH` (`/llm`); see the module docstring."""

    def __init__(self, relay: SharedRelay, settings: Settings) -> None:
        self._relay = relay
        self._settings = settings
        self._session: aiohttp.ClientSession | None = None

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        # Starlette versions differ on whether a mounted app's `path` keeps the mount prefix.
        prefix = PUBLIC_RELAY_PATH.rsplit("/", 1)[0]
        path = scope["path"] if scope["path"].startswith(prefix + "/") else prefix + scope["path"]
        suffix = path[len(prefix):]  # "/v1/chat/completions"
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        token = _bearer(headers.get("authorization")) or _key(headers)
        relay = self._relay.running
        if token is None or relay is None or not relay.accepts(token):
            await _error(send, 401, "invalid, expired or revoked relay token", "authentication_error")
            return
        body = await _read_body(receive, self._settings.relay_max_body_bytes)
        if body is None:
            await _error(send, 413, f"request body over {self._settings.relay_max_body_bytes} bytes", "too_large")
            return
        if self._session is None:
            # No total deadline: a streamed answer lasts as long as the model generates; the relay bounds it.
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None), auto_decompress=False)
        url = relay.base_url.removesuffix("/v1") + suffix
        if scope.get("query_string"):
            url += "?" + scope["query_string"].decode("latin-1")
        forwarded = {k: v for k, v in headers.items() if k in _FORWARDED}
        started = False
        try:
            async with self._session.request(scope["method"], url, data=body, headers=forwarded,
                                             allow_redirects=False) as answer:
                out = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in answer.headers.items()
                       if k.lower() not in _HOP_BY_HOP]
                await send({"type": "http.response.start", "status": answer.status, "headers": out})
                started = True
                async for chunk in answer.content.iter_any():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except aiohttp.ClientError:
            # The relay ended the call (its lease revoked, the server stopping): the agent sees the stream end,
            # or a 502 if nothing was sent yet.
            if not started:
                await _error(send, 502, "the relay ended the call", "relay_error")
                return
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _bearer(value: str | None) -> str | None:
    if value is None or not value.lower().startswith("bearer "):
        return None
    token = value[7:].strip()
    return token or None


def _key(headers: dict[str, str]) -> str | None:
    """The token as a dialect's clients send it (Anthropic's `x-api-key`, Google's `x-goog-api-key`)."""
    key = next((value for name in key_headers() if (value := headers.get(name.lower()))), "").strip()
    return key or None


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The request body, or None once it passes `limit` bytes (the rest is not read)."""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"".join(parts)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
        if not message.get("more_body"):
            return b"".join(parts)


async def _error(send: Send, status: int, message: str, kind: str) -> None:
    data = json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
