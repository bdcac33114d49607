"""`build_app(settings) -> FastAPI`: every route, one session manager, and the lifespan that runs them.

Lifespan: check the sandbox backends, start the idle reaper and the MCP SDK's session manager; on shutdown close
every session (running rollouts are cancelled and their sandboxes torn down) before the MCP session manager
stops, then release the backends.

With `settings.enable_web_interface` (the default) the Gradio tab is mounted at `/web` and `/` redirects there;
without the `ui` extra (gradio) installed the server runs without it and logs why.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, WebSocket

from coding_agent_env.api.endpoint import McpDispatcher
from coding_agent_env.api.http import ENV_DESCRIPTION, build_router
from coding_agent_env.api.mcp import McpEndpoint
from coding_agent_env.api.relay_route import PublicRelayRoute
from coding_agent_env.api.startup import check_backends
from coding_agent_env.api.ws import serve_ws, serve_ws_mcp
from coding_agent_env.sandbox.registry import Backends
from coding_agent_env.session import SessionManager
from coding_agent_env.settings import PUBLIC_RELAY_PATH, Settings

__all__ = ["HTTP_API_VERSION", "build_app"]

log = logging.getLogger(__name__)

HTTP_API_VERSION = "1.0.0"
"""OpenAPI `info.version`: the OpenEnv HTTP profile we speak (openenv-http/1.x), not the package version."""


def build_app(settings: Settings | None = None) -> FastAPI:
    """A complete app. Each call builds independent state (sandbox backends, sessions, MCP server)."""
    settings = settings or Settings.from_env()
    backends = Backends(settings)
    manager = SessionManager(settings, backends)
    mcp = McpEndpoint(manager, settings)
    on_shutdown: list[Callable[[], Awaitable[None]]] = []

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            app.state.backends = await check_backends(backends)
            manager.start()
            async with mcp.session_manager_running():
                try:
                    yield
                finally:
                    for stop in on_shutdown:
                        await stop()
                    await manager.stop()
        finally:
            await backends.aclose()

    app = FastAPI(title="coding_agent_env", description=ENV_DESCRIPTION, version=HTTP_API_VERSION, lifespan=lifespan)
    app.state.settings = settings
    app.state.sessions = manager
    app.include_router(build_router(manager))
    app.add_route("/mcp", McpDispatcher(manager, mcp, settings), methods=["GET", "POST", "DELETE"], include_in_schema=False)

    relay_route = PublicRelayRoute(manager.relay, settings)
    on_shutdown.append(relay_route.aclose)
    app.mount(PUBLIC_RELAY_PATH.rsplit("/", 1)[0], relay_route)

    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        await serve_ws(websocket, manager, settings)

    @app.websocket("/mcp")
    async def ws_mcp(websocket: WebSocket) -> None:
        await serve_ws_mcp(websocket, manager, settings)

    if settings.enable_web_interface:
        _mount_web(app, manager, on_shutdown)
    return app


def _mount_web(app: FastAPI, manager: SessionManager, on_shutdown: list[Callable[[], Awaitable[None]]]) -> None:
    if importlib.util.find_spec("gradio") is None:
        log.warning("web interface off: gradio is not installed (pip install 'coding-agent-env[ui]')")
        return
    from coding_agent_env.api.ui import mount_web  # gradio is heavy: imported only when the tab is served

    on_shutdown.append(mount_web(app, manager).stop)
