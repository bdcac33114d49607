"""The tab's mounting: built in the background once the server is up, served at /web with `/` redirecting to it,
"starting" (503, never 404) until then, a clear 503 if it cannot be built, absent with ENABLE_WEB_INTERFACE=false."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from coding_agent_env.api import build_app
from coding_agent_env.settings import Settings
from tests.helpers import poll, wait_until

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 120.0


async def test_web_starts_in_the_background_and_root_redirects(settings: Settings) -> None:
    app = build_app(settings)
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), \
            httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        health = await client.get("/health")  # answered while the tab may still be building
        assert health.json() == {"status": "healthy"}
        seen = set()

        async def built() -> httpx.Response | None:
            page = await client.get("/web/")
            seen.add(page.status_code)
            if page.status_code == 200:
                return page
            assert page.status_code == 503 and page.headers["retry-after"] == "1" and "starting" in page.text
            return None

        page = await poll(built, "the tab to come up", timeout_s=DEADLINE_S, interval_s=0.05)
        assert "text/html" in page.headers["content-type"] and seen <= {200, 503}
        root, web = await client.get("/"), await client.get("/web")
        assert root.status_code == web.status_code == 307
        assert root.headers["location"] == web.headers["location"] == "/web/"


async def test_shutdown_while_the_tab_is_building_does_not_hang(settings: Settings) -> None:
    app = build_app(settings)
    async with asyncio.timeout(60):
        async with app.router.lifespan_context(app):
            pass  # the build just started: leaving cancels it and waits for it
    assert not app.state.web.building


async def test_web_interface_can_be_turned_off(settings: Settings) -> None:
    settings = Settings.from_env({"ENABLE_WEB_INTERFACE": "false"}, state_dir=settings.state_dir)
    assert settings.enable_web_interface is False
    transport = httpx.ASGITransport(app=build_app(settings))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        root, page, health = [await client.get(path) for path in ("/", "/web/", "/health")]
    assert root.status_code == page.status_code == 404 and health.status_code == 200


def test_a_tab_that_cannot_be_built_leaves_the_server_up(tmp_path: Path) -> None:
    """A `gradio` that fails to import (a package of that name earlier on the path) stands for a broken install."""
    shim = tmp_path / "shim" / "gradio"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text('raise ImportError("this gradio is broken")\n')
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": f"{shim.parent}:{ROOT}", "STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.Popen([sys.executable, "-m", "coding_agent_env.cli", "serve", "--port", str(port)],
                            cwd=tmp_path, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"

        def answered() -> httpx.Response | None:
            try:
                page = httpx.get(url + "/web/", timeout=2)
            except httpx.TransportError:
                page = None
            if page is not None and "could not start" in page.text:
                return page
            assert page is None or page.status_code == 503, page.status_code
            assert proc.poll() is None, "the server exited"
            return None

        page = wait_until(answered, "a clear answer at /web", timeout_s=DEADLINE_S, interval_s=0.05)
        assert page.status_code == 503 and "this gradio is broken" in page.text
        assert httpx.get(url + "/health", timeout=2).json() == {"status": "healthy"}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(20)
