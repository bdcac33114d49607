"""`RelayChat`: Terminus's chat completions through the relay's loopback listener, with the rollout's token.

Contract: `complete(body)` never raises for anything the relay, the network or the model does; it returns the
assistant message, or a `ChatFailed` saying why (an error status, a body over `max_response_bytes`, a malformed
or nested-too-deep reply, no answer, a conversation that cannot be encoded: the model's earlier tool calls are
kept verbatim, and a deep enough one no JSON encoder takes). Encoding a long conversation and decoding a large reply run on a worker
thread (`OFF_LOOP_BYTES`), so no rollout holds the event loop for long.
"""

from __future__ import annotations

import functools
import io
import json

import aiohttp

from coding_agent_env.agents.terminus.core import ChatFailed, message_of
from coding_agent_env.aio import off_loop
from coding_agent_env.streams import read_at_most

__all__ = ["MAX_RESPONSE_BYTES", "OFF_LOOP_BYTES", "RelayChat"]

MAX_RESPONSE_BYTES = 16 * 1024 * 1024
"""Largest chat completion read from the relay, by default."""
OFF_LOOP_BYTES = 128 * 1024
"""JSON bodies and replies over this size are encoded, decoded and parsed on a worker thread."""


class RelayChat:
    """One rollout's chat client; an async context (it owns an HTTP session)."""

    def __init__(
        self, base_url: str, token: str, *, timeout_s: float, max_response_bytes: int = MAX_RESPONSE_BYTES
    ) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.max_response_bytes = max_response_bytes
        # No cookie jar and no proxies from the environment: the relay is on this host's loopback.
        self.http = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar(), trust_env=False)
        self.last_body_bytes = 0

    async def __aenter__(self) -> RelayChat:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.http.close()

    async def complete(self, body: dict) -> tuple[dict | ChatFailed, bool]:
        """(the assistant message of one chat completion, or why there is none; whether the reply was large)."""
        encode = functools.partial(json.dumps, body)
        try:
            text = await off_loop(encode) if self.last_body_bytes > OFF_LOOP_BYTES else encode()
        except (ValueError, TypeError, RecursionError) as exc:
            return ChatFailed(f"the conversation cannot be encoded as JSON ({type(exc).__name__})"), False
        payload = text.encode()
        self.last_body_bytes = len(payload)
        cap = self.max_response_bytes
        try:
            # A file-like body: aiohttp sends it in chunks.
            async with self.http.post(self.url, data=io.BytesIO(payload), headers=self.headers,
                                      timeout=self.timeout) as response:
                data = await read_at_most(response.content, cap + 1)
                if len(data) > cap:
                    return ChatFailed(f"response over {cap} bytes"), False
                if response.status != 200:
                    return ChatFailed(f"HTTP {response.status}: {data[:500].decode('utf-8', 'replace')}"), False
            large = len(data) > OFF_LOOP_BYTES
            return (await off_loop(_message, data) if large else _message(data)), large
        except (aiohttp.ClientError, TimeoutError) as exc:
            return ChatFailed(f"{type(exc).__name__}: {str(exc)[:500]}"), False


def _message(data: bytes) -> dict | ChatFailed:
    try:
        return message_of(json.loads(data))
    except (ValueError, RecursionError) as exc:
        return ChatFailed(f"{type(exc).__name__}: {str(exc)[:500]}")
