"""The root Dockerfile, built and run for real (marker `image`; needs a reachable dockerd, skipped otherwise).

The image is built by `tests.image.build` (how, with no registry reachable, and why CI starts that build early);
the container uses `--network host` and binds 127.0.0.1 only.
"""

from __future__ import annotations

import json
import secrets
import socket
import time

import httpx
import pytest

from tests.helpers import wait_until
from tests.image.build import BuildFailed, Unavailable, app_image, docker

pytestmark = pytest.mark.image

HEALTH_DEADLINE_S = 180.0
ORACLE = {
    "instruction": "Create hello.txt containing 'hi'.",
    "agent": "oracle",
    "solution": ["echo hi > hello.txt"],
    "verify": ["grep -qx hi hello.txt"],
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_healthy(url: str, name: str) -> None:
    def logs() -> str:
        tail = docker("logs", "--tail", "40", name, timeout=30)
        return (tail.stdout + tail.stderr).decode()

    def healthy() -> bool:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return True
        except httpx.TransportError:
            pass
        state = docker("inspect", "-f", "{{.State.Running}}", name, timeout=30).stdout.decode().strip()
        if state != "true":
            raise AssertionError(f"container not healthy (running={state}): {logs()}")
        return False

    wait_until(healthy, lambda: f"the container to be healthy: {logs()}", timeout_s=HEALTH_DEADLINE_S, interval_s=0.5)


def _wait_web(url: str) -> None:
    """The tab is built in the background after /health answers: "starting" (503) until then, never 404."""
    def built() -> bool:
        status = httpx.get(url + "/web/", timeout=30).status_code
        assert status in (200, 503), status
        return status == 200

    wait_until(built, "the tab to be built", timeout_s=HEALTH_DEADLINE_S, interval_s=0.2)


def image_or_skip() -> str:
    """The built image's tag; the test skips where no engine can build it, and fails where the build fails."""
    try:
        return app_image()
    except Unavailable as exc:
        pytest.skip(str(exc))
    except BuildFailed as exc:
        pytest.fail(f"the Dockerfile did not build: {exc}")


def test_dockerfile_builds_serves_a_rollout_and_stops_cleanly() -> None:
    tag = image_or_skip()
    name, port = f"cae-image-test-{secrets.token_hex(4)}", _free_port()
    run = docker("run", "-d", "--name", name, "--network", "host", "-e", "HOST=127.0.0.1", "-e", f"PORT={port}",
                  tag)
    assert run.returncode == 0, run.stderr.decode()
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, name)
        assert docker("exec", name, "id", "-u").stdout.strip() == b"1000"  # non-root
        _wait_web(url)
        params = {"name": "run_rollout", "arguments": ORACLE}
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
        reply = httpx.post(url + "/mcp", json=body, timeout=120).json()
        data = reply["result"]["data"]
        assert (data["status"], data["reward"]) == ("completed", 1.0), reply
        # What was really in effect: never none (docs/concepts/isolation-tiers.md).
        assert data["isolation"] in ("bwrap", "landlock")
        agents = docker("exec", name, "coding-agent-env", "agents", "list", timeout=60)
        installed = {a["name"] for a in json.loads(agents.stdout)["agents"] if a["installed"]}
        assert installed == {"opencode", "pi"}, agents.stdout.decode()  # the image's AGENTS default, no more
        started = time.monotonic()
        assert docker("stop", "-t", "30", name, timeout=60).returncode == 0
        assert time.monotonic() - started < 25, "the server ignored SIGTERM and was killed"
        code = docker("inspect", "-f", "{{.State.ExitCode}}", name, timeout=30).stdout.decode().strip()
        assert code == "0", f"exit code {code}"
    finally:
        docker("rm", "-f", name, timeout=60)
