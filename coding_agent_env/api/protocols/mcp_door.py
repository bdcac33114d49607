"""`/mcp`: one URL, two dialects, dispatched by the MCP handshake (DESIGN.md "Decisions").

A request that carries an `Mcp-Session-Id` header, or a POST whose body is an `initialize` request, goes to
the real MCP server (mcp.py). Any other POST is OpenEnv JSON-RPC (jsonrpc.py), answered with status 200
whatever the outcome. A GET or DELETE without a session header gets 405, as upstream's does. A body larger
than `ws_max_message_bytes` gets 413. A JSON-RPC client that disconnects before its answer cancels the call
(and so its rollout, whose sandbox is torn down).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from starlette.types import Receive, Scope, Send

from coding_agent_env.api.protocols.asgi import header, send_json
from coding_agent_env.api.protocols.jsonrpc import PARSE_ERROR, RpcContext, dispatch
from coding_agent_env.api.protocols.mcp import SESSION_HEADER, McpEndpoint
from coding_agent_env.api.protocols.shapes import loads_bounded, rpc_error
from coding_agent_env.session import SessionManager
from coding_agent_env.settings import Settings

__all__ = ["McpDispatcher"]


class _TooLarge(Exception):
    pass


class McpDispatcher:
    """The ASGI app registered at `/mcp`."""

    def __init__(self, manager: SessionManager, mcp: McpEndpoint, settings: Settings) -> None:
        self.manager = manager
        self.mcp = mcp
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if header(scope, SESSION_HEADER) is not None:
            await self.mcp.handle(scope, receive, send, None)
            return
        if scope["method"] != "POST":
            await send_json(send, 405, {"detail": "Method Not Allowed"})
            return
        try:
            body = await _read_body(receive, self.settings.ws_max_message_bytes)
        except _TooLarge:
            await send_json(send, 413, {"detail": "Request body too large"})
            return
        try:
            message = loads_bounded(body, self.settings.max_json_depth)
        except ValueError:
            await send_json(send, 200, rpc_error(None, PARSE_ERROR, "Parse error"))
            return
        if isinstance(message, dict) and message.get("method") == "initialize":
            await self.mcp.handle(scope, receive, send, body)
            return
        reply = await _unless_disconnected(dispatch(message, RpcContext(manager=self.manager)), receive)
        if reply is not None:
            await send_json(send, 200, reply)


async def _unless_disconnected(call: Coroutine[Any, Any, dict[str, Any]], receive: Receive) -> dict[str, Any] | None:
    """Run `call`, cancelling it if the client disconnects first (a rollout it started is torn down)."""
    task = asyncio.ensure_future(call)
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
        await asyncio.wait({task, watcher})
    return None if task.cancelled() else task.result()


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _read_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message: dict[str, Any] = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)
