"""The root Dockerfile, built and run for real (marker `image`; needs a reachable dockerd, skipped otherwise).

No container registry is reachable here, so both build arguments point at locally imported images:
`BASE_IMAGE` is a `debootstrap --variant=minbase` bookworm with python3 (cached as `cae-test/base:bookworm`),
`NODE_IMAGE` holds this host's Node >= 20 (cached as `cae-test/node:host`). The build and the container use
`--network host` (pip, npm and apt registries during the build; the container binds 127.0.0.1 only).
"""

from __future__ import annotations

import io
import json
import os
import secrets
import shutil
import socket
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.image

ROOT = Path(__file__).resolve().parents[2]
BASE_TAG = "cae-test/base:bookworm"
NODE_TAG = "cae-test/node:host"
APP_TAG = "cae-test/app:ci"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
HOST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
CA_ENV = ("NODE_EXTRA_CA_CERTS", "PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")
"""Pointed at the base's CA bundle, so node, pip and Python's ssl in the build trust what this host trusts."""
BUILD_TIMEOUT_S = 1200
HEALTH_DEADLINE_S = 180.0
ORACLE = {
    "instruction": "Create hello.txt containing 'hi'.",
    "agent": "oracle",
    "solution": ["echo hi > hello.txt"],
    "verify": ["grep -qx hi hello.txt"],
}


def _docker(*args: str, timeout: float = 120, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["docker", *args], input=stdin, capture_output=True, timeout=timeout, check=False)


def _require_docker() -> None:
    if shutil.which("docker") is None:
        pytest.skip("no docker CLI (apt-get install docker.io; .ci/run does)")
    info = _docker("info", "--format", "{{.ServerVersion}}", timeout=20)
    if info.returncode != 0:
        why = info.stderr.decode()[-200:]
        pytest.skip(f"no dockerd reachable (.ci/run starts one without bridge or iptables): {why}")


def _have(tag: str) -> bool:
    return _docker("image", "inspect", tag, timeout=30).returncode == 0


def _import(tar_bytes: bytes, tag: str, *changes: str) -> None:
    flags = [arg for change in changes for arg in ("--change", change)]
    done = _docker("import", *flags, "-", tag, stdin=tar_bytes, timeout=600)
    assert done.returncode == 0, done.stderr.decode()


def _base_image() -> str:
    if _have(BASE_TAG):
        return BASE_TAG
    if shutil.which("debootstrap") is None or os.geteuid() != 0:
        pytest.skip("building the base image needs root and debootstrap (apt-get install debootstrap)")
    with tempfile.TemporaryDirectory(prefix="cae-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        subprocess.run(
            ["debootstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates",
             "bookworm", str(rootfs), DEBIAN_MIRROR],
            check=True, capture_output=True, timeout=900,
        )
        _trust_host_cas(rootfs)
        tar = subprocess.run(["tar", "-C", str(rootfs), "-c", "."], check=True, capture_output=True, timeout=300)
    _import(tar.stdout, BASE_TAG, *(f"ENV {name}={HOST_CA_BUNDLE}" for name in CA_ENV))
    return BASE_TAG


def _trust_host_cas(rootfs: Path) -> None:
    """Give the base the CAs this host trusts (a TLS-inspecting egress proxy's, say), so pip and npm in the
    build reach their registries the way they do here. The Dockerfile stays free of machine specifics."""
    local = Path("/usr/local/share/ca-certificates")
    if local.is_dir():
        shutil.copytree(local, rootfs / local.relative_to("/"), dirs_exist_ok=True)
    if Path(HOST_CA_BUNDLE).is_file():
        shutil.copy(HOST_CA_BUNDLE, rootfs / HOST_CA_BUNDLE.lstrip("/"))


def _node_image() -> str:
    if _have(NODE_TAG):
        return NODE_TAG
    node, npm = Path("/usr/bin/node"), Path("/usr/lib/node_modules/npm")
    if not node.exists() or not npm.is_dir():
        pytest.skip("the host has no Node + npm at /usr/bin/node and /usr/lib/node_modules/npm to import")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(node, arcname="usr/local/bin/node")
        tar.add(npm, arcname="usr/local/lib/node_modules/npm")
    _import(buf.getvalue(), NODE_TAG)
    return NODE_TAG


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_healthy(url: str, name: str) -> None:
    deadline = time.monotonic() + HEALTH_DEADLINE_S
    while True:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        state = _docker("inspect", "-f", "{{.State.Running}}", name, timeout=30).stdout.decode().strip()
        if state != "true" or time.monotonic() > deadline:
            logs = _docker("logs", "--tail", "40", name, timeout=30)
            raise AssertionError(f"container not healthy (running={state}): {(logs.stdout + logs.stderr).decode()}")
        time.sleep(0.5)


def _wait_web(url: str) -> None:
    """The tab is built in the background after /health answers: "starting" (503) until then, never 404."""
    deadline = time.monotonic() + HEALTH_DEADLINE_S
    while True:
        status = httpx.get(url + "/web/", timeout=30).status_code
        if status == 200:
            return
        assert status == 503 and time.monotonic() < deadline, status
        time.sleep(0.2)


def test_dockerfile_builds_serves_a_rollout_and_stops_cleanly() -> None:
    _require_docker()
    build = _docker(
        "build", "--force-rm", "--network", "host", "--build-arg", f"BASE_IMAGE={_base_image()}",
        "--build-arg", f"NODE_IMAGE={_node_image()}", "-t", APP_TAG, str(ROOT), timeout=BUILD_TIMEOUT_S,
    )
    assert build.returncode == 0, build.stderr.decode()[-4000:]
    name, port = f"cae-image-test-{secrets.token_hex(4)}", _free_port()
    run = _docker("run", "-d", "--name", name, "--network", "host", "-e", "HOST=127.0.0.1", "-e", f"PORT={port}",
                  APP_TAG)
    assert run.returncode == 0, run.stderr.decode()
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, name)
        assert _docker("exec", name, "id", "-u").stdout.strip() == b"1000"  # non-root
        _wait_web(url)
        params = {"name": "run_rollout", "arguments": ORACLE}
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
        reply = httpx.post(url + "/mcp", json=body, timeout=120).json()
        data = reply["result"]["data"]
        assert (data["status"], data["reward"]) == ("completed", 1.0), reply
        assert data["isolation"] in ("bwrap", "none")  # what was really in effect, reported honestly
        agents = _docker("exec", name, "coding-agent-env", "agents", "list", timeout=60)
        assert agents.returncode == 0, agents.stderr.decode()
        assert all(a["installed"] for a in json.loads(agents.stdout)["agents"]), agents.stdout.decode()
        started = time.monotonic()
        assert _docker("stop", "-t", "30", name, timeout=60).returncode == 0
        assert time.monotonic() - started < 25, "the server ignored SIGTERM and was killed"
        code = _docker("inspect", "-f", "{{.State.ExitCode}}", name, timeout=30).stdout.decode().strip()
        assert code == "0", f"exit code {code}"
    finally:
        _docker("rm", "-f", name, timeout=60)
