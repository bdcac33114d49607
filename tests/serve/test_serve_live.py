"""`coding-agent-env serve` as real subprocesses answering /health; one-line CLI errors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers import free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "coding_agent_env.cli"]
START_DEADLINE_S = 30.0



class Served:
    def __init__(self, argv: list[str], cwd: Path, port: int) -> None:
        self.port = port
        self.proc = subprocess.Popen(
            argv, cwd=cwd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )

    def get(self, path: str) -> httpx.Response:

        def answer() -> httpx.Response | None:
            try:
                return httpx.get(f"http://127.0.0.1:{self.port}{path}", timeout=5)
            except httpx.TransportError:
                if self.proc.poll() is not None:
                    raise AssertionError(f"server exited: {self.proc.stderr.read() if self.proc.stderr else ''}") from None
                return None

        return wait_until(answer, f"the server to answer {path}", timeout_s=START_DEADLINE_S, interval_s=0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if self.proc.stderr:
            self.proc.stderr.close()


@pytest.fixture
def launch() -> Iterator[list[Served]]:
    started: list[Served] = []
    yield started
    for served in started:
        served.stop()


def write_env(directory: Path) -> Path:
    (directory / "server").mkdir(parents=True)
    (directory / "server" / "__init__.py").write_text("")
    (directory / "server" / "app.py").write_text(textwrap.dedent("""
        from fastapi import FastAPI

        app = FastAPI()


        @app.get("/health")
        def health() -> dict:
            return {"status": "healthy", "env": "minimal"}
    """))
    (directory / "openenv.yaml").write_text("spec_version: 1\nname: minimal\ntype: space\nruntime: fastapi\n"
                                            "app: server.app:app\nport: 8000\n")
    return directory


def test_serves_this_package(launch: list[Served], tmp_path: Path) -> None:
    port = free_port()
    served = Served([*CLI, "serve", "--port", str(port)], tmp_path, port)
    launch.append(served)
    assert served.get("/health").json() == {"status": "healthy"}
    assert served.get("/metadata").json()["name"] == "coding_agent_env"


@pytest.mark.parametrize("reload", [False, True])
def test_serves_an_env_dir(launch: list[Served], tmp_path: Path, reload: bool) -> None:
    env = write_env(tmp_path / "minimal_env")
    port = free_port()
    argv = [*CLI, "serve", str(env), "--port", str(port), *(["--reload"] if reload else [])]
    served = Served(argv, tmp_path, port)
    launch.append(served)
    assert served.get("/health").json() == {"status": "healthy", "env": "minimal"}


def test_uvicorn_from_the_root(launch: list[Served]) -> None:
    port = free_port()
    argv = [sys.executable, "-m", "uvicorn", "server.app:app", "--host", "127.0.0.1", "--port", str(port)]
    served = Served(argv, ROOT, port)
    launch.append(served)
    assert served.get("/health").json() == {"status": "healthy"}


@pytest.mark.parametrize("args", [["serve", "/no/such/dir"], ["serve", "--port", "x"]])
def test_cli_errors_are_one_line(args: list[str], tmp_path: Path) -> None:
    done = subprocess.run([*CLI, *args], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("coding-agent-env: ")
