"""Fixtures: OpenEnv's released clients in their own cached virtualenvs (`tests.compat.venvs`), and a live
server subprocess. If pip cannot reach the package index, the tests are skipped with that reason.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.compat import venvs
from tests.helpers import serving, wait_until

START_DEADLINE_S = 30.0


def _made(make: Callable[[], Path]) -> Path:
    try:
        return make()
    except venvs.IndexUnreachable as exc:
        pytest.skip(f"{exc}: the compat tests install OpenEnv's released packages from PyPI into side virtualenvs "
                    "(`python3 -m tests.compat.venvs`)")
    except venvs.InstallFailed as exc:
        raise AssertionError(str(exc)) from None


@pytest.fixture(scope="session")
def gen_a() -> Path:
    return _made(lambda: venvs.released_client(venvs.GEN_A))


@pytest.fixture(scope="session")
def gen_b() -> Path:
    return _made(lambda: venvs.released_client(venvs.GEN_B))


@pytest.fixture(scope="session")
def trainer_venv() -> Path:
    """Python of a trainer's environment (see `venvs.trainer`): this checkout re-installed every session."""
    return _made(venvs.trainer)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def launch_server(cwd: Path, env: dict[str, str] | None = None, port: int | None = None,
                  args: tuple[str, ...] = ()) -> Iterator[str]:
    """`coding-agent-env serve [ARGS]` on `port` (default: a free loopback port) with `env` added to ours; killed
    (by process group) afterwards. Yields its URL once `/health` answers."""
    port = port or _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "coding_agent_env.cli", "serve", "--port", str(port), *args],
        cwd=cwd, start_new_session=True, env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(serving(f"{url}/health", proc), "the server to start", timeout_s=START_DEADLINE_S, interval_s=0.05)
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
