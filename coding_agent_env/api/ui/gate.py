"""The web tab, started in the background so the server answers at once.

Importing gradio and building the tab takes seconds; `/health` and the API must not wait for it. `WebGate` is
mounted at `/web` when the app is built (it imports nothing heavy) and is built into the real tab by `start()`,
called from the app's lifespan once the server is up: gradio is imported and the Blocks built on a worker
thread (under `api.heap.building()`: collector paused, short GIL switch interval, what it built frozen
after), then the tab's own startup (gradio's queue) runs on the server's loop. Until the tab is ready, `/web`
answers 503 with `Retry-After: 1` and a small page that reloads itself ("starting"): never a 404, never a hang.
If building fails, the server stays up and `/web` answers 503 saying why (the error is logged too); a missing
`ui` extra says which extra to install. `stop()` (at shutdown) cancels a build still running, waits for it, and
stops the tab's runs and episodes.
"""

from __future__ import annotations

import asyncio
import html
import importlib
import importlib.util
import logging
from contextlib import AsyncExitStack
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from coding_agent_env.aio import shielded
from coding_agent_env.api import heap
from coding_agent_env.session import SessionManager

__all__ = ["WEB_PATH", "WebGate"]

log = logging.getLogger(__name__)

WEB_PATH = "/web"
_UI_MODULE = "coding_agent_env.api.ui.tab"


class WebGate:
    """The ASGI app at `/web`: the tab once built, a "starting" (or "failed") answer before."""

    def __init__(self, manager: SessionManager) -> None:
        self._manager = manager
        self._app: ASGIApp | None = None
        self._failure: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._stack = AsyncExitStack()
        self._tab: Any = None

    @property
    def ready(self) -> bool:
        return self._app is not None

    @property
    def building(self) -> bool:
        """Whether a build is under way (started and not yet finished, cancelled or failed)."""
        return self._task is not None and not self._task.done()

    @property
    def failure(self) -> str | None:
        """Why the tab could not be built, once that is known."""
        return self._failure

    def start(self) -> None:
        """Begin building the tab in the background (on the running loop). Idempotent."""
        if self._task is not None or self._app is not None:
            return
        if importlib.util.find_spec("gradio") is None:
            self._failure = "gradio is not installed (pip install 'coding-agent-env[ui]')"
            log.warning("web interface off: %s", self._failure)
            return
        self._task = asyncio.get_running_loop().create_task(self._build(), name="web-tab-build")

    async def wait_ready(self) -> None:
        """Until the build has finished, either way (for callers that want the tab up before going on)."""
        if self._task is not None:
            await asyncio.wait({self._task})

    async def stop(self) -> None:
        """Cancel a build still running (waiting for it), close the tab's startup context, stop its work."""
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            await shielded(asyncio.wait({task}))
        try:
            await self._stack.aclose()
        finally:
            if self._tab is not None:
                await self._tab.stop()

    async def _build(self) -> None:
        try:
            # The import and the build are seconds of CPU on a worker thread while the loop serves: `heap.building`
            # keeps them from holding the loop (GIL hand-overs, full collections of the growing heap).
            with heap.building():
                ui = await asyncio.to_thread(importlib.import_module, _UI_MODULE)
                tab, holder, gradio_app = await asyncio.to_thread(ui.build_web, self._manager)
            self._tab = tab
            # The tab's own lifespan (gradio's queue and startup events), kept open until stop().
            await self._stack.enter_async_context(holder.router.lifespan_context(holder))
            self._app = gradio_app
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure leaves the server up and is reported at /web
            self._failure = f"{type(exc).__name__}: {exc}"
            log.exception("web interface failed to start")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._app is not None:
            await self._app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1013})  # try again later
            return
        if scope["type"] != "http":
            return
        if self._failure is not None:
            await _page(send, "The web tab could not start", self._failure, refresh=False)
        else:
            await _page(send, "The web tab is starting", "This page reloads itself in a moment.", refresh=True)


async def _page(send: Send, title: str, detail: str, *, refresh: bool) -> None:
    head = '<meta http-equiv="refresh" content="1">' if refresh else ""
    body = (f"<!doctype html><html><head><title>{html.escape(title)}</title>{head}</head>"
            f"<body><h1>{html.escape(title)}</h1><p>{html.escape(detail)}</p></body></html>").encode()
    headers = [(b"content-type", b"text/html; charset=utf-8"), (b"content-length", str(len(body)).encode()),
               (b"cache-control", b"no-store")]
    if refresh:
        headers.append((b"retry-after", b"1"))
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body})
