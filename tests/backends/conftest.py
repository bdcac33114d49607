"""Engines for the backend suite: a real dockerd (with the offline test image), hf-sandbox's own in-pod server
on loopback, and a fake of the e2b SDK. Each backend kind's settings and backends come from `backend_for`.

Docker: the daemon at DOCKER_HOST (or the default socket). Without one the Docker cases are skipped, except
under CI (`CI=true`), where `.ci/run` starts dockerd and a missing daemon is a failure.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from pydantic import SecretStr

from coding_agent_env.sandbox import Backends, Sandbox, SandboxBackend
from coding_agent_env.sandbox.docker import LABEL_OWNER
from coding_agent_env.sandbox.remote.e2b import E2bBackend
from coding_agent_env.settings import BackendConfig, DockerConfig, E2bConfig, HfConfig, LocalConfig, Settings
from coding_agent_env.settings.backends import K8sConfig
from tests.backends.rootfs import HOST_BINDS, IMAGE, ensure_image
from tests.fakes.e2b_fake import FakeAsyncSandbox
from tests.fakes.k8s_standin import LABEL_SANDBOX, K8sStandIn
from tests.helpers import sandbox_processes, serving, wait_until

_SERVER_START_S = 30.0


def _docker_host() -> str:
    return os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[Any]:
    """A client of a live dockerd holding the test image (imported offline if missing)."""
    import docker
    import docker.errors
    import requests.exceptions

    client = None
    socket_path = _docker_host().removeprefix("unix://")
    if _docker_host().startswith("unix://") and not os.path.exists(socket_path):
        # Checked first: the SDK leaks its session's socket when building a client fails.
        if os.environ.get("CI") == "true":
            pytest.fail(f"no Docker daemon at {_docker_host()} under CI")
        pytest.skip(f"no Docker daemon at {_docker_host()}: start one with `dockerd --bridge=none --iptables=false &` "
                    "(as .ci/run does) or set DOCKER_HOST")
    try:
        # The client asks the daemon for its API version as it is built: that is the first contact.
        client = docker.DockerClient(base_url=_docker_host())
        client.ping()
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        if client is not None:
            client.close()
        if os.environ.get("CI") == "true":
            pytest.fail(f"no Docker daemon at {_docker_host()} under CI: {exc}")
        pytest.skip(f"no Docker daemon at {_docker_host()} ({type(exc).__name__}): start one with "
                    "`dockerd --bridge=none --iptables=false &` (as .ci/run does) or set DOCKER_HOST")
    ensure_image(client)
    yield client
    client.close()


@pytest.fixture(scope="session")
def hf_server() -> Iterator[tuple[str, str]]:
    """hf-sandbox's own in-pod RPC server, run on loopback: (url, sandbox token)."""
    token = secrets.token_urlsafe(16)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "hf_sandbox.server:app", "--host", "127.0.0.1", "--port", str(port),
         "--log-level", "warning"],
        env={"PATH": os.environ["PATH"], "HF_SANDBOX_TOKEN": token, "HOME": "/tmp"},
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc)
        yield url, token
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


def _wait_healthy(url: str, proc: subprocess.Popen[bytes]) -> None:
    wait_until(serving(f"{url}/health", proc, timeout_s=1), "the hf-sandbox server to become healthy",
               timeout_s=_SERVER_START_S, interval_s=0.05)


BackendFactory = Callable[..., SandboxBackend]


class Target(NamedTuple):
    """A backend kind set up on this machine's engines: its name, settings enabling it (beside `local`), and
    `Backends` of those settings (holding the test stand-ins, e.g. the e2b fake)."""

    name: str
    settings: Settings
    backends: Backends


@pytest.fixture
async def backend_for(request: pytest.FixtureRequest, settings: Settings) -> AsyncIterator[Callable[..., Target]]:
    """`backend_for(kind, **setting_overrides)` -> that backend kind's `Target` (kinds: `BACKENDS` in
    test_contract); its `Backends` are closed after the test."""
    made: list[Backends] = []

    def build(kind: str, **overrides: Any) -> Target:
        name, configs, stand_ins = kind_configs(kind, request, settings)
        enabled = settings.model_copy(update=overrides).with_backends(*configs)
        made.append(Backends(enabled, overrides=stand_ins(enabled)))
        return Target(name, enabled, made[-1])

    yield build
    for backends in made:
        await backends.aclose()


@pytest.fixture
def make_backend(backend_for: Callable[..., Target]) -> Callable[[str], BackendFactory]:
    """`make_backend(kind)(**setting_overrides)` -> that backend, configured for this machine's engines."""

    def for_kind(kind: str) -> BackendFactory:
        def build(**overrides: Any) -> SandboxBackend:
            target = backend_for(kind, **overrides)
            return target.backends.get(target.name)

        return build

    return for_kind


Overrides = Callable[[Settings], dict[str, SandboxBackend]]


def kind_configs(kind: str, request: pytest.FixtureRequest,
                 settings: Settings) -> tuple[str, tuple[BackendConfig, ...], Overrides]:
    """(backend name, the backend configs to enable, the stand-in backends to use for them)."""
    local = settings.backend_config("local")
    assert isinstance(local, LocalConfig)
    real: Overrides = lambda enabled: {}  # noqa: E731
    if kind == "local":
        return "local", (local,), real
    if kind == "local-unisolated":  # the operator's explicit opt-in to unisolated commands
        return "local", (local.model_copy(update={"isolation": "none"}),), real
    if kind == "local-landlock":  # the tier of unprivileged containers, forced here (bubblewrap works too)
        return "local", (local.model_copy(update={"isolation": "landlock"}),), real
    if kind in ("docker", "docker-exec", "docker-image", "docker-layers"):
        request.getfixturevalue("docker_engine")
        request.getfixturevalue("no_leftover_containers")
        # `docker-exec`: the transport for daemons not on this host (machinery copied in, commands as execs).
        transport = "exec" if kind == "docker-exec" else "auto"
        # `docker-image`: group templates committed into images, as on a daemon whose layers the server cannot read;
        # `docker-layers`: kept as their layers or refused.
        fork = {"docker-image": "image", "docker-layers": "layers"}.get(kind, "auto")
        docker = DockerConfig(host=_docker_host(), image=IMAGE, host_binds=HOST_BINDS, transport=transport, fork=fork)
        return "docker", (local, docker), real
    if kind == "hf":
        url, token = request.getfixturevalue("hf_server")
        return "hf", (local, HfConfig(url=url, token=SecretStr(token), root=str(settings.state_dir))), real
    if kind == "e2b-fake":
        e2b = E2bConfig(root=str(settings.state_dir))
        return "e2b", (local, e2b), lambda enabled: {"e2b": E2bBackend(e2b, enabled, sdk=FakeAsyncSandbox)}
    if kind == "k8s":
        cluster = request.getfixturevalue("k8s_standin")
        k8s = K8sConfig(router_url=cluster.router_url, server_id=f"test-{cluster.id}")
        return "k8s", (local, k8s), real
    raise AssertionError(kind)


@pytest.fixture(scope="session")
def kubeconfig_path(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One KUBECONFIG for the session: the `kubernetes` client reads the variable once, when imported; each
    stand-in writes its own cluster into this file."""
    path = tmp_path_factory.mktemp("kube") / "config"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KUBECONFIG", str(path))
        patch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # never the in-cluster config
        yield path


@pytest.fixture
def k8s_standin(docker_engine: Any, kubeconfig_path: Path) -> Iterator[K8sStandIn]:
    """The Kubernetes API + agent-sandbox + router stand-in (tests/fakes/k8s_standin.py), pods on the real
    dockerd with no network, the session's KUBECONFIG pointing at it. Fails the test if a claim or a pod is
    left."""
    with K8sStandIn(docker_engine, kubeconfig=kubeconfig_path) as cluster:
        yield cluster
        claims, pods = cluster.claim_names(), cluster.pods()
    assert not claims and not pods, f"claims left: {claims}; pods left: {[p.name for p in pods]}"


@pytest.fixture
def no_leftover_containers(docker_engine: Any) -> Iterator[None]:
    """Fails the test if a container made by this server process is left."""
    owner = f"{socket.gethostname()}/{os.getpid()}"
    yield
    left = docker_engine.containers.list(all=True, filters={"label": f"{LABEL_OWNER}={owner}"})
    for container in left:
        container.remove(force=True, v=True)  # its tmpfs volumes too
    assert not left, f"containers left behind: {[c.id[:12] for c in left]}"


def processes(box: Sandbox, settings: Settings, docker_engine: Any | None = None) -> list[str]:
    """Command lines of the sandbox's live processes, as an operator would see them."""
    if box.backend not in ("docker", "k8s"):
        return sandbox_processes(settings)
    import docker.errors

    try:
        if box.backend == "k8s":  # the stand-in's pod
            pods = docker_engine.containers.list(filters={"label": f"{LABEL_SANDBOX}={box.id}"})
            if not pods:
                return []
            top = pods[0].top(ps_args="-eo pid,stat,args")
        else:
            top = docker_engine.containers.get(box.id).top(ps_args="-eo pid,stat,args")
    except docker.errors.NotFound:
        return []
    return [" ".join(row) for row in top.get("Processes") or [] if "Z" not in row[1] and "launcher.py init" not in row[2]]


def state_entries(settings: Settings) -> list[Path]:
    return sorted(settings.state_dir.iterdir()) if settings.state_dir.exists() else []


def forwarder_source_path() -> str:
    import importlib.util

    spec = importlib.util.find_spec("coding_agent_env.llm.forwarder")
    assert spec is not None and spec.origin is not None
    return spec.origin
