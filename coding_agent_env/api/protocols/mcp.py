"""Real MCP at `/mcp`: the official SDK's `MCPServer` over Streamable HTTP, serving every tool of the table
(`api.tools`): `run_rollout`, and an interactive episode's two: `start_episode` (the task arguments `reset` takes)
and `terminal` (a command, or the final answer that ends and scores the episode), in the caller's MCP session.

`McpEndpoint` wraps the SDK's ASGI app so MCP sessions share the server's capacity: an `initialize` without
an `Mcp-Session-Id` takes a slot (or gets JSON-RPC `-32000` at capacity), the id the SDK assigns is bound to
that slot, a `DELETE` frees it, and the idle reaper frees it after `session_idle_timeout_s` (the SDK's own
idle timeout is the same). A request naming an id that is no longer ours gets 404, which tells an MCP client
to start a new session. A tool runs in the caller's session, so closing the session cancels it.

The parent app's lifespan must enter `session_manager_running()`: a mounted sub-app's lifespan never runs.
"""

from __future__ import annotations

import inspect
import json
from contextlib import AbstractAsyncContextManager
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool as SdkTool
from mcp_types import CallToolResult, TextContent
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from coding_agent_env import __version__
from coding_agent_env.api.protocols.asgi import header, replay, send_json
from coding_agent_env.api.protocols.shapes import rpc_error
from coding_agent_env.api.tools import TOOLS, Serialised, Tool, ToolCallFailed
from coding_agent_env.session import Session, SessionKind, SessionManager
from coding_agent_env.session.errors import CapacityError, SessionClosedError, UnknownSessionError
from coding_agent_env.settings import Settings

__all__ = ["McpEndpoint", "SESSION_HEADER"]

SESSION_HEADER = "mcp-session-id"
_SERVER_ERROR = -32000


class McpEndpoint:
    """The SDK's Streamable HTTP app plus the binding of MCP session ids to our sessions."""

    def __init__(self, manager: SessionManager, settings: Settings) -> None:
        self.manager = manager
        self._bound: dict[str, str] = {}
        tools = [self._sdk_tool(tool) for tool in TOOLS]
        self.server = MCPServer(name="coding_agent_env", version=__version__, tools=tools, log_level="WARNING")
        self.app: ASGIApp = self.server.streamable_http_app(
            streamable_http_path="/mcp",
            session_idle_timeout=settings.session_idle_timeout_s,
            max_sessions=settings.max_concurrent_envs,
            max_request_body_size=settings.ws_max_message_bytes,
            host=settings.host,
        )

    def session_manager_running(self) -> AbstractAsyncContextManager[Any]:
        return self.server.session_manager.run()

    # -- the tools -------------------------------------------------------------------------------------

    def _sdk_tool(self, tool: Tool[Any]) -> SdkTool:
        """The SDK's tool for one of ours: keyword parameters as `tool.mcp_parameters()` declares them, the
        input schema ours, the result adapted here (text and structured content), failures as `ToolError`."""

        async def call(ctx: Context, **arguments: Any) -> CallToolResult:
            session = self._session_of(ctx)
            try:
                reply = await tool.call(session, tool.mcp_arguments(arguments))
            except ToolCallFailed as exc:
                raise ToolError(exc.message) from None
            except SessionClosedError as exc:
                raise ToolError(f"{exc} (start a new MCP session)") from None
            data = reply.data.value if isinstance(reply.data, Serialised) else dict(reply.data)
            return CallToolResult(content=[TextContent(type="text", text=reply.text)], structured_content=data)

        params = [inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=Context)]
        params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=Any, default=default)
                   for name, default in tool.mcp_parameters()]
        returns = tool.output_model or CallToolResult
        call.__signature__ = inspect.Signature(params, return_annotation=returns)  # type: ignore[attr-defined]
        call.__annotations__ = {"ctx": Context, "return": returns}
        structured = {"structured_output": True} if tool.output_model is not None else {}
        sdk_tool = SdkTool.from_function(call, name=tool.name, description=tool.description, **structured)
        return sdk_tool.model_copy(update={"parameters": tool.schema()})

    def _session_of(self, ctx: Context) -> Session:
        request = ctx.request_context.request
        mcp_id = request.headers.get(SESSION_HEADER) if request is not None else None
        our_id = self._bound.get(mcp_id or "")
        try:
            return self.manager.get(our_id or "")
        except UnknownSessionError:
            raise ToolError("this MCP session has no server session (closed or reaped); start a new one") from None

    # -- ASGI ------------------------------------------------------------------------------------------

    async def handle(self, scope: Scope, receive: Receive, send: Send, body: bytes | None) -> None:
        """Serve one MCP request; `body` is the already-read POST body (None for GET/DELETE)."""
        mcp_id = header(scope, SESSION_HEADER)
        if mcp_id is None:
            await self._initialize(scope, receive, send, body)
            return
        our_id = self._bound.get(mcp_id)
        if our_id is None or not self._alive(our_id):
            self._bound.pop(mcp_id, None)
            await send_json(send, 404, rpc_error(None, -32001, "Session not found"))
            return
        self.manager.get(our_id).touch()
        await self.app(scope, replay(receive, body), send)
        if scope["method"] == "DELETE":
            self._bound.pop(mcp_id, None)
            await self.manager.close(our_id)

    async def _initialize(self, scope: Scope, receive: Receive, send: Send, body: bytes | None) -> None:
        try:
            session = self.manager.create(SessionKind.MCP, Headers(scope=scope))
        except CapacityError as exc:
            data = {"active_sessions": exc.active, "max_sessions": exc.maximum}
            await send_json(send, 200, rpc_error(_request_id(body), _SERVER_ERROR, str(exc), data))
            return
        assigned: list[str] = []

        async def capture(message: Message) -> None:
            if message["type"] == "http.response.start":
                for key, value in message.get("headers", []):
                    if key.decode("latin-1").lower() == SESSION_HEADER:
                        assigned.append(value.decode("latin-1"))
            await send(message)

        try:
            await self.app(scope, replay(receive, body), capture)
        finally:
            if assigned:
                self._bound[assigned[0]] = session.id
            else:
                await self.manager.close(session.id)

    def _alive(self, our_id: str) -> bool:
        try:
            self.manager.get(our_id)
        except UnknownSessionError:
            return False
        return True


def _request_id(body: bytes | None) -> Any:
    try:
        message = json.loads(body or b"")
    except (ValueError, RecursionError):
        return None
    return message.get("id") if isinstance(message, dict) else None
