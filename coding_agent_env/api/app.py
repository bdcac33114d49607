"""`build_app(settings) -> FastAPI`: every route, one session manager, and the lifespan that runs them.

Lifespan: start the event-loop watchdog (`aio_watchdog`; off with `settings.loop_watchdog`; its figures at
`/health/loop`, itself at `app.state.loop_watchdog`), check the sandbox backends, start the idle reaper and the
MCP SDK's session manager, then freeze what startup made out of the garbage collector (`api.heap`). On shutdown
close every session (running rollouts are cancelled and their sandboxes torn down) before the MCP session
manager stops, then release the backends, stop the watchdog and thaw the frozen objects.

With `settings.enable_web_interface` (the default) the Gradio tab is served at `/web` and `/` redirects there. It is
built in the background once the server is up (`api.ui.gate`): until then `/web` answers 503 "starting" (never
404); without the `ui` extra (gradio) it answers 503 saying which extra to install. The relay's public route for
remote sandboxes is mounted at `/llm` (`api.relay_route`); task image builds, when the operator allows them, at
`/images` (`api.images`). With a task set (`settings.tasks`, `serve --tasks`) OpenEnv's Task API serves it
(`api.protocols.task_api`; without one its routes answer 501 as openenv's do).

Metrics (`observe.metrics`): one `ServerMetrics` per app, its own registry, fed by the session manager (its live
sessions and episodes at each scrape, every finished rollout through `on_result`, every episode call and end), the
Task API's routes and `/images`; served at `GET /metrics` in Prometheus's text format unless
`settings.metrics_enabled` is off (404), and only to `Authorization: Bearer <settings.metrics_token>` when that is
set (401 otherwise; compared in constant time).

The caller credential: with `settings.api_token` set, `api.caller_auth.CallerAuth` wraps the whole app (every
route, mounts included) and lets through only requests carrying the token, but for the few open paths it names
(`/health`, `/metadata`, ...; the relay's public route keeps its per-rollout tokens, the web tab its login).

The rooms: `api.protocols` (the doors: WS, JSON-RPC, MCP, HTTP), `api.tools` (the one table of tools they share),
`api.ui` (the Gradio tab); this module only composes them.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, WebSocket
from fastapi.responses import RedirectResponse
from starlette.requests import Request
from starlette.responses import Response

from coding_agent_env.aio_watchdog import LoopWatchdog
from coding_agent_env.api import heap
from coding_agent_env.api.caller_auth import CallerAuth
from coding_agent_env.api.images import IMAGES_PATH, ImageBuildRoute
from coding_agent_env.api.protocols.mcp_door import McpDispatcher
from coding_agent_env.api.protocols.http import ENV_DESCRIPTION, ENV_NAME, build_router
from coding_agent_env.api.protocols.task_api import build_task_router
from coding_agent_env.api.protocols.mcp import McpEndpoint
from coding_agent_env.api.protocols.ws import serve_ws, serve_ws_mcp
from coding_agent_env.api.relay_route import PublicRelayRoute
from coding_agent_env.api.startup import check_backends
from coding_agent_env.api.ui.gate import WEB_PATH, WebGate
from coding_agent_env.models import RolloutResult
from coding_agent_env.observe.metrics import CONTENT_TYPE_LATEST, ServerMetrics
from coding_agent_env.observe.tracing import Tracing
from coding_agent_env.runs.recorder import ServerRecorder
from coding_agent_env.sandbox.registry import Backends
from coding_agent_env.session import SessionManager
from coding_agent_env.sandbox.base import SandboxLimits
from coding_agent_env.settings import PUBLIC_RELAY_PATH, Settings
from coding_agent_env.tasks.base import TaskOptions
from coding_agent_env.errors import RequestError
from coding_agent_env.tasks.catalog import TaskCatalog

__all__ = ["HTTP_API_VERSION", "build_app"]

log = logging.getLogger(__name__)

HTTP_API_VERSION = "1.0.0"
"""OpenAPI `info.version`: the OpenEnv HTTP profile we speak (openenv-http/1.x), not the package version."""


def build_app(settings: Settings | None = None, *, tracing: Tracing | None = None) -> FastAPI:
    """A complete app. Each call builds independent state (sandbox backends, sessions, MCP server). `tracing`:
    where its spans go (default: as the `OTEL_*` variables say, `observe.tracing`)."""
    settings = settings or Settings.from_env()
    tracing = tracing if tracing is not None else Tracing.from_env()
    backends = Backends(settings)
    catalog = load_catalog(settings)
    metrics = ServerMetrics(backends=settings.sandbox_backends, task_sets=[s["name"] for s in catalog.splits()])
    manager = SessionManager(settings, backends, catalog, metrics=metrics)
    manager.tracing = tracing
    metrics.watch(manager.live_counts)
    manager.on_result.append(lambda result: metrics.rollout_finished(result, task_set_of(catalog, result)))
    manager.on_result.append(lambda result: catalog.observe(result.task_id, result.reward, result.wall_s))
    mcp = McpEndpoint(manager, settings)
    on_shutdown: list[Callable[[], Awaitable[None]]] = []
    on_startup: list[Callable[[], None]] = []
    if settings.results_from_server:
        recorder = ServerRecorder(settings)
        manager.on_result.append(recorder)
        on_shutdown.append(recorder.aclose)

    watchdog = _watchdog(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if watchdog is not None:
            watchdog.start()  # first, so the startup checks and the shutdown are watched too
        try:
            app.state.backends = await check_backends(backends)
            manager.start()
            async with mcp.session_manager_running():
                try:
                    for start in on_startup:
                        start()
                    heap.freeze()  # before the first request: startup's objects out of every later collection
                    yield
                finally:
                    for stop in on_shutdown:
                        await stop()
                    await manager.stop()
                    tracing.shutdown()  # after the sessions: their last spans are flushed
        finally:
            try:
                await backends.aclose()
            finally:
                if watchdog is not None:
                    watchdog.stop()  # synchronous: a cancelled shutdown still ends its thread
                heap.thaw()

    app = FastAPI(title="coding_agent_env", description=ENV_DESCRIPTION, version=HTTP_API_VERSION, lifespan=lifespan)
    app.state.settings = settings
    app.state.sessions = manager
    app.state.loop_watchdog = watchdog
    app.state.metrics = metrics
    app.include_router(build_router(manager, watchdog))
    app.include_router(build_task_router(manager.catalog, ENV_NAME, metrics))
    app.add_route("/metrics", _metrics_route(metrics, settings), methods=["GET"], include_in_schema=False)
    app.add_route("/mcp", McpDispatcher(manager, mcp, settings), methods=["GET", "POST", "DELETE"], include_in_schema=False)

    images = ImageBuildRoute(backends, settings, metrics)
    app.add_route(IMAGES_PATH, images.handle, methods=["POST"], include_in_schema=False)

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
        web = _mount_web(app, manager)
        app.state.web = web
        on_startup.append(web.start)
        on_shutdown.append(web.stop)
    if settings.api_token is not None:
        app.add_middleware(CallerAuth, settings=settings)  # in front of every route and mount
    return app


def load_catalog(settings: Settings) -> TaskCatalog:
    """The task set of `settings.tasks`, laid out for the default sandbox backend and clamped to its limits;
    `CatalogSourceError` stops startup when a source is missing or loads nothing."""
    if not settings.tasks:
        return TaskCatalog()
    options = TaskOptions(sandbox=settings.default_backend, caps=SandboxLimits.from_settings(settings),
                          image_map=settings.image_map)
    return TaskCatalog.load(settings.tasks, options, sampler=settings.task_sampler,
                            group_size=settings.task_sampler_group_size)


def task_set_of(catalog: TaskCatalog, result: RolloutResult) -> str | None:
    """The split of the server's task set a finished rollout ran a task of, told by its `task_id` (a task of the
    set runs under the set's id for it); None for any other rollout, counted as `adhoc`. A request sending its own
    task under an id the set uses counts as that split: the result does not say how the task was named."""
    if not catalog or not result.task_id:
        return None
    try:
        return catalog.by_id(result.task_id).split
    except RequestError:
        return None


def _metrics_route(metrics: ServerMetrics, settings: Settings) -> Callable[[Request], Awaitable[Response]]:
    """`GET /metrics`: 404 when metrics are off, 401 without the token when one is set, else the exposition."""
    token = settings.metrics_token.get_secret_value().encode() if settings.metrics_token is not None else None

    async def serve(request: Request) -> Response:
        if not settings.metrics_enabled:
            return Response("Not Found", status_code=404, media_type="text/plain")
        if token is not None:
            scheme, _, given = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token):
                return Response("Unauthorized", status_code=401, media_type="text/plain",
                                headers={"WWW-Authenticate": "Bearer"})
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    return serve


def _watchdog(settings: Settings) -> LoopWatchdog | None:
    if not settings.loop_watchdog:
        return None
    return LoopWatchdog(settings.loop_tick_ms / 1000, settings.loop_stall_warn_ms / 1000)


def _mount_web(app: FastAPI, manager: SessionManager) -> WebGate:
    """`/` and `/web` redirect to `/web/`, where the gate serves the tab once `start()` has built it."""
    gate = WebGate(manager)

    @app.get("/", include_in_schema=False)
    @app.get(WEB_PATH, include_in_schema=False)
    async def to_web() -> RedirectResponse:
        return RedirectResponse(f"{WEB_PATH}/", status_code=307)

    app.mount(WEB_PATH, gate)
    return gate
