"""`WS /ws`: OpenEnv's envelope protocol (PROTOCOL.md §2).

One reply per request, strictly in order; `close` gets none. The socket owns a new session, or with
`?session_id=` attaches to one created over JSON-RPC (detaching leaves it alive unless a close was requested).
Replies are encoded by `shapes.dumps` (a tool's result goes out as the JSON text it was serialised to once).
Frames are read concurrently with the processing of earlier ones, so a disconnect during a rollout is seen
at once: it cancels that rollout (the sandbox is torn down) and frees the session.

Error frames: `{"type":"error","data":{"message","code",...}}`; this module's `_serve_frame` is the one place
that maps failures to codes. Bad frames leave the connection usable; capacity and attach errors close it, as
does a `step` in a session that runs nothing more (`SESSION_ERROR`: closed, or closing since an
`openenv/session/close` arrived while attached), which ends the session.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from starlette.websockets import WebSocket, WebSocketDisconnect

from coding_agent_env.api.protocols.jsonrpc import PARSE_ERROR, SERVER_ERROR, RpcContext, dispatch
from coding_agent_env.api.protocols.step import reset, step
from coding_agent_env.api.protocols.shapes import WS_ENVELOPES, dumps, loads_bounded, rpc_error
from coding_agent_env.errors import RequestError
from coding_agent_env.session import Session, SessionKind, SessionManager
from coding_agent_env.session.errors import CapacityError, SessionClosedError, SessionError
from coding_agent_env.settings import Settings

__all__ = ["serve_ws", "serve_ws_mcp"]

log = logging.getLogger(__name__)

_CLOSE_NORMAL = 1000
_CLOSE_TOO_BIG = 1009
_CLOSE = object()
"""Processor result for a `close` envelope: leave the loop without a reply."""


@dataclass(frozen=True)
class _Last:
    """Processor result: send this frame, then leave the loop (the connection closes normally)."""

    frame: dict[str, Any]


def error_frame(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"type": "error", "data": {"message": message, "code": code, **extra}}


async def serve_ws(websocket: WebSocket, manager: SessionManager, settings: Settings) -> None:
    """Run one `/ws` connection to its end; the session is closed (or detached) whatever happens."""
    await websocket.accept()
    attach_id = websocket.query_params.get("session_id")
    try:
        session = manager.attach(attach_id) if attach_id else manager.create(SessionKind.WS, websocket.headers)
    except CapacityError as exc:
        frame = error_frame("CAPACITY_REACHED", str(exc), active_sessions=exc.active, max_sessions=exc.maximum)
        await _refuse(websocket, frame)
        return
    except SessionError as exc:
        await _refuse(websocket, error_frame("SESSION_ERROR", str(exc)))
        return
    try:
        await _Connection(websocket, session, manager, settings).run()
    finally:
        if attach_id:
            await manager.detach(session)
        else:
            await manager.close(session.id)


async def _refuse(websocket: WebSocket, frame: dict[str, Any]) -> None:
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        await websocket.send_text(dumps(frame))
        await websocket.close(_CLOSE_NORMAL)


class _Connection:
    def __init__(self, websocket: WebSocket, session: Session, manager: SessionManager, settings: Settings) -> None:
        self.websocket = websocket
        self.session = session
        self.settings = settings
        self.rpc = RpcContext(manager=manager, bound=session)
        self.inbox: asyncio.Queue[str | None] = asyncio.Queue()

    async def run(self) -> None:
        """Read and process concurrently; whichever ends first (disconnect, or `close`) ends the other."""
        reader = asyncio.ensure_future(self._read())
        processor = asyncio.ensure_future(self._process())
        try:
            await asyncio.wait({reader, processor}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (processor, reader):
                task.cancel()
            await asyncio.wait({reader, processor})
        if processor.done() and not processor.cancelled() and processor.exception() is None:
            with contextlib.suppress(WebSocketDisconnect, RuntimeError):
                await self.websocket.close(_CLOSE_NORMAL)

    async def _read(self) -> None:
        while True:
            message = await self.websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            text = message.get("text")
            if text is None:
                text = (message.get("bytes") or b"").decode("utf-8", "replace")
            if len(text) > self.settings.ws_max_message_bytes:
                await self.websocket.close(_CLOSE_TOO_BIG)
                return
            await self.inbox.put(text)

    async def _process(self) -> None:
        while True:
            text = await self.inbox.get()
            reply = await self._serve_frame(text)
            if reply is _CLOSE:
                return
            if isinstance(reply, _Last):
                await self.websocket.send_text(dumps(reply.frame))
                return
            await self.websocket.send_text(dumps(reply))

    async def _serve_frame(self, text: str) -> Any:
        try:
            raw = loads_bounded(text, self.settings.max_json_depth)
        except ValueError as exc:
            return error_frame("INVALID_JSON", f"Invalid JSON: {exc}")
        kind = raw.get("type") if isinstance(raw, dict) else None
        model = WS_ENVELOPES.get(kind) if isinstance(kind, str) else None
        if model is None:
            return error_frame("UNKNOWN_TYPE", f"Unknown message type: {_describe(kind)}")
        try:
            message = model.model_validate(raw)
            return await self._handle(kind, message)
        except ValidationError as exc:
            errors = json.loads(exc.json(include_input=False, include_url=False))
            return error_frame("VALIDATION_ERROR", "Invalid message", errors=errors)
        except SessionClosedError as exc:
            return _Last(error_frame("SESSION_ERROR", str(exc)))
        except RequestError as exc:  # a call this server will not run (bad task arguments, say): that call's error
            return error_frame("EXECUTION_ERROR", str(exc))
        except Exception as exc:  # the one except-site: a bug must not kill the connection
            log.exception("ws session %s: %s failed", self.session.id, kind)
            return error_frame("EXECUTION_ERROR", f"{type(exc).__name__}: {exc}")

    async def _handle(self, kind: str, message: Any) -> Any:
        if kind == "close":
            return _CLOSE
        if kind == "state":
            return {"type": "state", "data": self.session.snapshot().model_dump()}
        if kind == "reset":
            return {"type": "observation", "data": await reset(self.session, message.data)}
        if kind == "mcp":
            return {"type": "mcp", "data": await dispatch(message.data, self.rpc)}
        return {"type": "observation", "data": await step(self.session, message.data)}


class _RawRpcConnection(_Connection):
    """`WS /mcp`: raw JSON-RPC request frames in, response frames out, bound to the socket's session."""

    async def _serve_frame(self, text: str) -> Any:
        try:
            raw = loads_bounded(text, self.settings.max_json_depth)
        except ValueError as exc:
            return rpc_error(None, PARSE_ERROR, f"Parse error: {exc}")
        return await dispatch(raw, self.rpc)


async def serve_ws_mcp(websocket: WebSocket, manager: SessionManager, settings: Settings) -> None:
    """Run one `WS /mcp` connection: a session of its own; at capacity one `-32000` frame, then close."""
    await websocket.accept()
    try:
        session = manager.create(SessionKind.WS, websocket.headers)
    except CapacityError as exc:
        data = {"active_sessions": exc.active, "max_sessions": exc.maximum}
        await _refuse(websocket, rpc_error(None, SERVER_ERROR, str(exc), data))
        return
    try:
        await _RawRpcConnection(websocket, session, manager, settings).run()
    finally:
        await manager.close(session.id)


def _describe(kind: Any) -> str:
    return kind if isinstance(kind, str) else json.dumps(kind)[:100]
