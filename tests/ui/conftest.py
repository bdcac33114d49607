"""A live server subprocess on 127.0.0.1 and Debian's headless Chromium driven by Playwright.

The server runs `uvicorn server.app:app` in its own process group (killed by PID at the end). Chromium is
`/usr/bin/chromium` (apt `chromium`; never `playwright install`); every request the page makes outside
127.0.0.1 is aborted, so the tab must work without the internet.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.helpers import serving, wait_until

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--no-first-run",
]
START_DEADLINE_S = 90.0
ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class UiServer:
    """`uvicorn server.app:app` in a subprocess; `url` once /health answers."""

    def __init__(self, state_dir: Path, log_path: Path, **env: str) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.state_dir = state_dir
        self.log_path = log_path
        environ = {**os.environ, "STATE_DIR": str(state_dir), "GRADIO_ANALYTICS_ENABLED": "False", **env}
        argv = [sys.executable, "-m", "uvicorn", "server.app:app", "--host", "127.0.0.1", "--port", str(self.port)]
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, cwd=ROOT, env=environ, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def wait_healthy(self) -> UiServer:
        # The tab is built in the background after /health answers: wait for the tab itself.
        wait_until(serving(self.url + "/web/", self.proc, self.log_path.read_text), "the server and its tab",
                   timeout_s=START_DEADLINE_S, interval_s=0.1)
        return self

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)

    def rpc(self, method: str, **params: object) -> dict:
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        return httpx.post(self.url + "/mcp", json=body, timeout=10).json()


@pytest.fixture(scope="module")
def ui_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UiServer]:
    # The state dir is not under pytest's tmp_path (0700): sandbox uids must traverse to their roots.
    state = Path(tempfile.mkdtemp(prefix="cae-ui-"))
    os.chmod(state, 0o711)
    uid_base = 300_000 + secrets.randbelow(20_000) * 64  # suites may run side by side: a uid range of our own
    server = UiServer(state, tmp_path_factory.mktemp("ui-server") / "server.log", MAX_CONCURRENT_ENVS="2",
                      SANDBOX_UID_BASE=str(uid_base), SANDBOX_UID_COUNT="64",
                      TASKS=str(ROOT / "examples" / "tasks" / "hello-file"))  # a task set: the tab offers it
    try:
        yield server.wait_healthy()
    finally:
        server.stop()
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not Path(CHROMIUM).exists() or shutil.which("chromium") is None:
        pytest.skip("Debian chromium is not installed (apt-get install chromium chromium-driver; .ci/run does)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(browser, ui_server: UiServer) -> Iterator[object]:  # noqa: ANN001 - playwright types
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(60_000)
    context.route("**/*", _loopback_only)
    page = context.new_page()
    try:
        yield page
    finally:
        context.close()


def _loopback_only(route) -> None:  # noqa: ANN001
    host = urlsplit(route.request.url).hostname or ""
    if host in ("127.0.0.1", "localhost") or route.request.url.startswith(("data:", "blob:")):
        route.continue_()
    else:
        route.abort()
