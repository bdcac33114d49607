"""Fixtures: OpenEnv's released clients in their own cached virtualenvs, and a live server subprocess.

The virtualenvs live under `.ci/venvs/` (gitignored), created on first use; a `.ready` marker says the
install finished. If pip cannot reach the package index, the tests are skipped with that reason.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
VENVS = ROOT / ".ci" / "venvs"
INSTALL_TIMEOUT_S = 900
START_DEADLINE_S = 30.0
_UNREACHABLE = ("NewConnectionError", "Max retries exceeded", "Temporary failure in name resolution",
                "Network is unreachable", "No matching distribution found")


def released_client(spec: str) -> Path:
    """Python of a virtualenv with `spec` installed (created once, then cached)."""
    venv = VENVS / spec.replace("==", "-")
    python = venv / "bin" / "python"
    if (venv / ".ready").exists():
        return python
    VENVS.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=120)
    pip = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", spec],
                         capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    if pip.returncode != 0:
        if any(marker in pip.stderr for marker in _UNREACHABLE):
            pytest.skip(f"pip cannot reach the package index to install {spec}")
        raise AssertionError(f"pip install {spec} failed:\n{pip.stderr[-2000:]}")
    (venv / ".ready").touch()
    return python


@pytest.fixture(scope="session")
def gen_a() -> Path:
    return released_client("openenv-core==0.3.0")


@pytest.fixture(scope="session")
def gen_b() -> Path:
    return released_client("openenv==0.10.0")


@pytest.fixture(scope="session")
def trainer_venv() -> Path:
    """Python of a trainer's environment: openenv 0.10.0 and this package without its server extra, resolved
    together by pip (created once); this checkout is re-installed (editable) every session, so a dependency
    change that no longer resolves beside openenv fails here."""
    venv = VENVS / "trainer-openenv-0.10.0"
    python = venv / "bin" / "python"
    if not (venv / ".ready").exists():
        VENVS.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=120)
        _pip(python, "openenv==0.10.0", "-e", str(ROOT))
        (venv / ".ready").touch()
    else:
        _pip(python, "-e", str(ROOT))
    return python


def _pip(python: Path, *args: str) -> None:
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
                          capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False)
    if done.returncode != 0:
        if any(marker in done.stderr for marker in _UNREACHABLE):
            pytest.skip("pip cannot reach the package index")
        raise AssertionError(f"pip install {' '.join(args)} failed:\n{done.stderr[-3000:]}")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def launch_server(cwd: Path, env: dict[str, str] | None = None, port: int | None = None) -> Iterator[str]:
    """`coding-agent-env serve` on `port` (default: a free loopback port) with `env` added to ours; killed (by
    process group) afterwards. Yields its URL once `/health` answers."""
    port = port or _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "coding_agent_env.cli", "serve", "--port", str(port)],
        cwd=cwd, start_new_session=True, env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_DEADLINE_S
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("server did not start")
            time.sleep(0.05)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.fixture(scope="module")
def live_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with launch_server(tmp_path_factory.mktemp("serve")) as url:
        yield url
