"""OpenEnv's JSON-RPC dialect (PROTOCOL.md §3.2-3.3): `tools/list`, `tools/call`, `openenv/session/create`,
`openenv/session/close`.

`dispatch(message, ctx)` takes one already-parsed request object and returns one response object; it never
raises. Over HTTP the answer is always status 200. `RpcContext.bound` is set when the request came over a
WebSocket (the `mcp` envelope): `session/create` then returns that socket's own session, and calls without
`session_id` run in it. Without a bound session or `session_id`, a `tools/call` runs in a temporary session
that holds a capacity slot for the call's duration.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from coding_agent_env.api.protocols.shapes import JsonRpcRequest, rpc_error, rpc_result, tool_result
from coding_agent_env.api.tools import Tool, ToolCallFailed, listing, openenv_tool
from coding_agent_env.session import Session, SessionKind, SessionManager
from coding_agent_env.session.errors import CapacityError, SessionClosedError, UnknownSessionError

__all__ = [
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "RpcContext",
    "SERVER_ERROR",
    "dispatch",
]

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
SERVER_ERROR = -32000


@dataclass
class RpcContext:
    manager: SessionManager
    bound: Session | None = None


class _RpcFailure(Exception):
    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


def capacity_failure(exc: CapacityError) -> _RpcFailure:
    return _RpcFailure(SERVER_ERROR, str(exc), {"active_sessions": exc.active, "max_sessions": exc.maximum})


async def dispatch(message: Any, ctx: RpcContext) -> dict[str, Any]:
    """Answer one JSON-RPC request object (never raises)."""
    try:
        request = JsonRpcRequest.model_validate(message)
    except ValidationError as exc:
        return rpc_error(None, INVALID_REQUEST, f"Invalid request: {_short(exc)}")
    handler = _METHODS.get(request.method)
    if handler is None:
        return rpc_error(request.id, METHOD_NOT_FOUND, f"Method not found: {request.method}")
    try:
        return rpc_result(request.id, await handler(request.params, ctx))
    except _RpcFailure as failure:
        return rpc_error(request.id, failure.code, failure.message, failure.data)


def _short(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'request'}: {e['msg']}" for e in exc.errors()[:3])


def _session_for(params: dict[str, Any], ctx: RpcContext) -> Session | None:
    session_id = params.get("session_id")
    if session_id is None:
        return ctx.bound
    if not isinstance(session_id, str):
        raise _RpcFailure(INVALID_PARAMS, "Invalid params - 'session_id' must be a string")
    try:
        session = ctx.manager.get(session_id)
    except UnknownSessionError as exc:
        raise _RpcFailure(INVALID_PARAMS, str(exc)) from None
    session.touch()
    return session


async def _tools_list(params: dict[str, Any], ctx: RpcContext) -> dict[str, Any]:
    session = _session_for(params, ctx)
    return {"tools": listing("inputSchema", session is not None and session.live_episode is not None)}


async def _tools_call(params: dict[str, Any], ctx: RpcContext) -> dict[str, Any]:
    name = params.get("name")
    if not isinstance(name, str):
        raise _RpcFailure(INVALID_PARAMS, "Missing 'name' in params")
    tool = openenv_tool(name)
    if tool is None:
        raise _RpcFailure(INTERNAL_ERROR, f"Unknown tool: '{name}'")
    session = _session_for(params, ctx)
    arguments = params.get("arguments", {})
    if session is not None:
        return await _call_in(session, tool, arguments)
    if not tool.offered(live_episode=False):  # a fresh temporary session cannot run it (terminal: no episode)
        raise _RpcFailure(INTERNAL_ERROR, f"Error calling tool '{name}': it needs a session_id (a session whose "
                          "reset started an episode)")
    try:
        temporary = ctx.manager.create(SessionKind.HTTP)
    except CapacityError as exc:
        raise capacity_failure(exc) from None
    try:
        return await _call_in(temporary, tool, arguments)
    finally:
        await ctx.manager.close(temporary.id)


async def _call_in(session: Session, tool: Tool[Any], arguments: Any) -> dict[str, Any]:
    arguments = {} if arguments is None else arguments
    try:
        return tool_result(await tool.call(session, arguments))
    except ToolCallFailed as exc:
        raise _RpcFailure(INTERNAL_ERROR, exc.message) from None
    except SessionClosedError as exc:  # like an unknown session_id: this session is no longer usable
        raise _RpcFailure(INVALID_PARAMS, str(exc)) from None


async def _session_create(params: dict[str, Any], ctx: RpcContext) -> dict[str, Any]:
    if ctx.bound is not None:
        return {"session_id": ctx.bound.id}
    try:
        session = ctx.manager.create(SessionKind.HTTP)
    except CapacityError as exc:
        raise capacity_failure(exc) from None
    return {"session_id": session.id}


async def _session_close(params: dict[str, Any], ctx: RpcContext) -> dict[str, Any]:
    session_id = params.get("session_id")
    if not isinstance(session_id, str) or not session_id:
        raise _RpcFailure(INVALID_PARAMS, "Invalid params - 'session_id' is required")
    if ctx.bound is not None and ctx.bound.id == session_id:
        raise _RpcFailure(INVALID_REQUEST, "Cannot close the session of the WebSocket this request came over")
    try:
        session = ctx.manager.get(session_id)
    except UnknownSessionError as exc:
        raise _RpcFailure(INVALID_PARAMS, str(exc)) from None
    if session.attached:
        session.request_close()
        return {"session_id": session_id, "closed": False, "closing": True}
    await ctx.manager.close(session_id)
    return {"session_id": session_id, "closed": True}


_METHODS: dict[str, Callable[[dict[str, Any], RpcContext], Awaitable[dict[str, Any]]]] = {
    "tools/list": _tools_list,
    "tools/call": _tools_call,
    "openenv/session/create": _session_create,
    "openenv/session/close": _session_close,
}
