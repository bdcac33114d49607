"""`build_app(settings) -> FastAPI`: every route, one session manager, and the lifespan that runs them.

Lifespan: start the idle reaper and the MCP SDK's session manager; on shutdown close every session (running
rollouts are cancelled and their sandboxes torn down) before the MCP session manager stops.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, WebSocket

from coding_agent_env.api.endpoint import McpDispatcher
from coding_agent_env.api.http import ENV_DESCRIPTION, build_router
from coding_agent_env.api.mcp import McpEndpoint
from coding_agent_env.api.ws import serve_ws, serve_ws_mcp
from coding_agent_env.session import SessionManager
from coding_agent_env.settings import Settings

__all__ = ["HTTP_API_VERSION", "build_app"]

HTTP_API_VERSION = "1.0.0"
"""OpenAPI `info.version`: the OpenEnv HTTP profile we speak (openenv-http/1.x), not the package version."""


def build_app(settings: Settings | None = None) -> FastAPI:
    """A complete app. Each call builds independent state (sessions, MCP server)."""
    settings = settings or Settings.from_env()
    manager = SessionManager(settings)
    mcp = McpEndpoint(manager, settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        manager.start()
        async with mcp.session_manager_running():
            try:
                yield
            finally:
                await manager.stop()

    app = FastAPI(title="coding_agent_env", description=ENV_DESCRIPTION, version=HTTP_API_VERSION, lifespan=lifespan)
    app.state.settings = settings
    app.state.sessions = manager
    app.include_router(build_router(manager))
    app.add_route("/mcp", McpDispatcher(manager, mcp, settings), methods=["GET", "POST", "DELETE"], include_in_schema=False)

    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        await serve_ws(websocket, manager, settings)

    @app.websocket("/mcp")
    async def ws_mcp(websocket: WebSocket) -> None:
        await serve_ws_mcp(websocket, manager, settings)

    return app
