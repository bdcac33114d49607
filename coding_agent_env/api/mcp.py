"""Real MCP at `/mcp`: the official SDK's `MCPServer` over Streamable HTTP, with the `run_rollout` tool and
an interactive episode's two: `start_episode` (the task arguments `reset` takes) and `terminal` (a command,
or the final answer that ends and scores the episode), in the caller's MCP session.

`McpEndpoint` wraps the SDK's ASGI app so MCP sessions share the server's capacity: an `initialize` without
an `Mcp-Session-Id` takes a slot (or gets JSON-RPC `-32000` at capacity), the id the SDK assigns is bound to
that slot, a `DELETE` frees it, and the idle reaper frees it after `session_idle_timeout_s` (the SDK's own
idle timeout is the same). A request naming an id that is no longer ours gets 404, which tells an MCP client
to start a new session. The tool runs the rollout in the caller's session, so closing the session cancels it.

The parent app's lifespan must enter `session_manager_running()`: a mounted sub-app's lifespan never runs.
"""

from __future__ import annotations

import inspect
import json
from contextlib import AbstractAsyncContextManager
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp_types import CallToolResult, TextContent
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from coding_agent_env import __version__
from coding_agent_env.api.asgi import header, replay, send_json
from coding_agent_env.api.terminal import episode_observation, run_terminal
from coding_agent_env.api.tool import TOOL_DESCRIPTION, TOOL_NAME, ToolCallFailed, run_tool
from coding_agent_env.api.wire import rpc_error
from coding_agent_env.episode.task import task_schema
from coding_agent_env.episode.terminal import TERMINAL_DESCRIPTION, TERMINAL_SCHEMA, TERMINAL_TOOL
from coding_agent_env.errors import RequestError
from coding_agent_env.models import RolloutRequest, RolloutResult, request_fields_schema
from coding_agent_env.session import Session, SessionKind, SessionManager
from coding_agent_env.session.errors import CapacityError, SessionClosedError, UnknownSessionError
from coding_agent_env.settings import Settings

__all__ = ["McpEndpoint", "SESSION_HEADER"]

SESSION_HEADER = "mcp-session-id"
START_EPISODE_DESCRIPTION = (
    "Start an interactive episode in this MCP session (ending its previous one): a fresh sandbox with the task's "
    "files, set up by its setup commands. Then call `terminal` with one command at a time, and finally with "
    "`final_answer`, which verifies and scores the episode."
)
_SERVER_ERROR = -32000


class McpEndpoint:
    """The SDK's Streamable HTTP app plus the binding of MCP session ids to our sessions."""

    def __init__(self, manager: SessionManager, settings: Settings) -> None:
        self.manager = manager
        self._bound: dict[str, str] = {}
        tools = [self._tool(), self._start_episode_tool(), self._terminal_tool()]
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

    # -- the tool --------------------------------------------------------------------------------------

    def _tool(self) -> Tool:
        async def run_rollout(ctx: Context, **arguments: Any) -> CallToolResult:
            session = self._session_of(ctx)
            try:
                result = await run_tool(session, TOOL_NAME, arguments)
            except ToolCallFailed as exc:
                raise ToolError(exc.message) from None
            except SessionClosedError as exc:
                raise ToolError(f"{exc} (start a new MCP session)") from None
            return _call_result(result)

        params = [inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=Context)]
        for name, field in RolloutRequest.model_fields.items():
            default = inspect.Parameter.empty if field.is_required() else field.get_default(call_default_factory=True)
            params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=Any, default=default))
        run_rollout.__signature__ = inspect.Signature(params, return_annotation=RolloutResult)  # type: ignore[attr-defined]
        run_rollout.__annotations__ = {"ctx": Context, "return": RolloutResult}
        tool = Tool.from_function(run_rollout, name=TOOL_NAME, description=TOOL_DESCRIPTION, structured_output=True)
        return tool.model_copy(update={"parameters": request_fields_schema()})

    def _start_episode_tool(self) -> Tool:
        async def start_episode(ctx: Context, **arguments: Any) -> CallToolResult:
            session = self._session_of(ctx)
            task = {name: value for name, value in arguments.items() if value is not None}
            try:
                episode = await session.start_episode(task)
            except SessionClosedError as exc:
                raise ToolError(f"{exc} (start a new MCP session)") from None
            except RequestError as exc:
                raise ToolError(f"Error calling tool 'start_episode': {exc}") from None
            observation = episode_observation(episode)["observation"]
            return CallToolResult(content=[TextContent(type="text", text=observation["text"])],
                                  structured_content=observation)

        schema = task_schema()
        names = list(schema["properties"])
        return _keyword_tool(start_episode, "start_episode", START_EPISODE_DESCRIPTION, schema, names)

    def _terminal_tool(self) -> Tool:
        async def terminal(ctx: Context, **arguments: Any) -> CallToolResult:
            session = self._session_of(ctx)
            given = {name: value for name, value in arguments.items() if value is not None}
            try:
                outcome = await run_terminal(session, given)
            except ToolCallFailed as exc:
                raise ToolError(exc.message) from None
            except SessionClosedError as exc:
                raise ToolError(f"{exc} (start a new MCP session)") from None
            result = outcome.result
            return CallToolResult(content=[TextContent(type="text", text=result["content"][0]["text"])],
                                  structured_content=result["data"])

        return _keyword_tool(terminal, TERMINAL_TOOL, TERMINAL_DESCRIPTION, TERMINAL_SCHEMA,
                             ["command", "final_answer"])

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
            session = self.manager.create(SessionKind.MCP)
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


def _keyword_tool(function: Any, name: str, description: str, schema: dict[str, Any], names: list[str]) -> Tool:
    """A tool taking `names` as optional keyword arguments (None when not given), described by `schema`."""
    params = [inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=Context)]
    params += [inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, annotation=Any, default=None) for key in names]
    function.__signature__ = inspect.Signature(params, return_annotation=CallToolResult)
    function.__annotations__ = {"ctx": Context, "return": CallToolResult}
    tool = Tool.from_function(function, name=name, description=description)
    return tool.model_copy(update={"parameters": schema})


def _call_result(result: RolloutResult) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=result.model_dump_json())],
        structured_content=result.model_dump(mode="json"),
    )


def _request_id(body: bytes | None) -> Any:
    try:
        message = json.loads(body or b"")
    except (ValueError, RecursionError):
        return None
    return message.get("id") if isinstance(message, dict) else None
