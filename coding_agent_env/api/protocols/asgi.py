"""Small raw-ASGI helpers shared by the /mcp endpoints."""

from __future__ import annotations

from typing import Any

from starlette.types import Message, Receive, Scope, Send

from coding_agent_env.api.protocols.shapes import dumps

__all__ = ["header", "replay", "send_json"]


def header(scope: Scope, name: str) -> str | None:
    for key, value in scope.get("headers", []):
        if key.decode("latin-1").lower() == name:
            return value.decode("latin-1")
    return None


def replay(receive: Receive, body: bytes | None) -> Receive:
    """A `receive` that first yields the already-read body, then defers to the real one."""
    if body is None:
        return receive
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def send_json(send: Send, status: int, payload: dict[str, Any]) -> None:
    """One JSON response (encoded by `shapes.dumps`: a tool's result as the text it was serialised to once)."""
    body = dumps(payload).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
