"""Live servers for the hostile-agent suite: one per backend kind per module, each in its own subprocess.

Docker: the daemon at DOCKER_HOST (or the default socket), with the offline test image imported if missing;
without a daemon the Docker cases skip, except under CI (`CI=true`), where `.ci/run` starts one.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.backends.rootfs import HOST_BINDS, IMAGE, ensure_image
from tests.hostile.server import HostileServer

BACKENDS = ["local", "local-landlock", "docker"]
"""`local-landlock`: the local backend forced to the tier of unprivileged containers (Landlock and seccomp)."""


def _docker_env() -> dict[str, str]:
    """The server's Docker settings, the test image imported; skips (fails under CI) without a daemon."""
    import docker

    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if host.startswith("unix://") and not os.path.exists(host.removeprefix("unix://")):
        if os.environ.get("CI") == "true":
            pytest.fail(f"no Docker daemon at {host} under CI")
        pytest.skip(f"no Docker daemon at {host}: start one with `dockerd --bridge=none --iptables=false &` (as .ci/run "
                    "does) or set DOCKER_HOST")
    client = docker.DockerClient(base_url=host)
    try:
        ensure_image(client)
    finally:
        client.close()
    return {"DOCKER_HOST": host, "DOCKER_IMAGE": IMAGE, "DOCKER_HOST_BINDS": ",".join(HOST_BINDS)}


@pytest.fixture(scope="module", params=BACKENDS)
def hostile_server(request: pytest.FixtureRequest) -> Iterator[tuple[str, HostileServer]]:
    """(backend name, a live server enabling it): every case of a module runs against each backend."""
    backend = request.param
    docker = _docker_env() if backend == "docker" else None
    parent = Path(tempfile.mkdtemp(prefix="cae-hostile-"))
    os.chmod(parent, 0o711)
    state = parent / "state"
    state.mkdir(mode=0o711)
    tier = {"LOCAL_ISOLATION": "landlock"} if backend == "local-landlock" else None
    server = HostileServer(state, docker=docker, settings=tier)
    try:
        yield backend, server
    finally:
        stopped = server.stop()
        log = server.log_text()
        # rm, not shutil.rmtree: what an attack left may be deeper than Python's recursion limit.
        subprocess.run(["rm", "-rf", "--one-file-system", str(parent)], check=False)
        assert stopped, f"the server ignored SIGTERM (needed SIGKILL): {log[-2000:]}"
