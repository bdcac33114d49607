"""The Docker backend: one container per rollout, driven through the `docker` SDK (sync, run in threads).

Each sandbox is a container of the request's image (or `DockerConfig.image`), labelled with the rollout id and
the owning server (`host/pid`, see `reaper`), with the network policy's network (`none` by default; `host`
only when `Settings.sandbox_allow_host_network`; `llm` = no network plus the relay's unix socket bind-mounted
and the LLM forwarder started inside once, so processes reach the relay at `relay_url`), a memory limit
(`sandbox_memory_mb`), a process limit (`sandbox_max_processes`) and a CPU quota (`DockerConfig.cpus`), all
capabilities dropped but the few its root-run launcher needs, and `no-new-privileges`.

Every command runs through the in-container launcher (`DockerSandbox`, a `LauncherSandbox`): as uid 1000, in
its own session, under a child subreaper so the whole tree is killed at the timeout, on cancellation, or when
it exits. How commands reach the launcher is the backend's transport, chosen once from `DockerConfig.transport`:
`control` (a socket to PID 1, for a daemon on this host) or `exec` (the engine's exec API, any daemon); see
`control` and `engine_exec`. Either way the environment travels outside any argv.

Containers of a server that died are removed, with their host directories, by `reap_orphans()`, run before the
first create.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import docker
import docker.errors

from coding_agent_env.backend_config import DockerConfig
from coding_agent_env.errors import SandboxError, SandboxUnavailableError
from coding_agent_env.sandbox.base import BackendStatus, Sandbox, SandboxBackend, SandboxSpec, rlimits
from coding_agent_env.sandbox.docker.control import ControlChannel
from coding_agent_env.sandbox.docker.engine import SDK_ERRORS, call, translate
from coding_agent_env.sandbox.docker.engine_exec import EngineExec
from coding_agent_env.sandbox.docker.hostdir import HostDir
from coding_agent_env.sandbox.docker.layout import AGENTS_DIR, RELAY_SOCKET
from coding_agent_env.sandbox.docker.reaper import LABEL_OWNER, LABEL_ROLLOUT, owner, reap
from coding_agent_env.sandbox.docker.sandbox import DockerSandbox, discard
from coding_agent_env.sandbox.docker.transport import DockerTransport
from coding_agent_env.settings import Settings

__all__ = ["DockerBackend"]

_CAPS = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETUID", "SETGID"]
"""Only the root-run launcher uses these; commands run as uid 1000 and have none."""


class DockerBackend(SandboxBackend):
    """Makes `DockerSandbox`es on the daemon at `DockerConfig.host`."""

    name = "docker"

    def __init__(self, config: DockerConfig, settings: Settings) -> None:
        self._config = config
        self._settings = settings
        self._client: docker.DockerClient | None = None
        self._reaped = False

    def client(self) -> docker.DockerClient:
        if self._client is None:
            self._client = docker.DockerClient(base_url=self._config.daemon_url)
        return self._client

    def _limits(self) -> tuple[dict[str, int], dict[str, int]]:
        """(what the container is asked to enforce, the rlimits the launcher sets on every command)."""
        s = self._settings
        engine = {"memory": s.sandbox_memory_mb * 1024 * 1024, "pids": s.sandbox_max_processes,
                  "nano_cpus": int(self._config.cpus * 1e9)}
        return engine, rlimits(s, nproc=False)

    def check(self) -> BackendStatus:
        engine, launcher = self._limits()
        limits = {**engine, **launcher}
        url = self._config.daemon_url
        socket_path = url.removeprefix("unix://")
        if url.startswith("unix://") and not os.path.exists(socket_path):
            return BackendStatus(self.name, False, None, f"no usable Docker daemon: no socket at {socket_path}", limits)
        image = self._config.image
        try:
            version = self.client().version()
            present = bool(self.client().images.list(name=image))
        except SDK_ERRORS as exc:
            err = translate(exc, "docker")
            return BackendStatus(self.name, False, None, f"no usable Docker daemon: {err}", limits)
        detail = f"Docker {version.get('Version', '?')}; default image {image!r} "
        detail += "present" if present else "absent (pulled at the first rollout)"
        return BackendStatus(self.name, True, "docker", detail, limits)

    def _transport(self) -> DockerTransport:
        """The transport for a new sandbox: see `DockerConfig.transport`."""
        choice = self._config.transport
        if choice == "auto":
            local = self._config.daemon_url.startswith("unix://")
            choice = "control" if local and HostDir.fits(self._settings.state_dir) else "exec"
        return ControlChannel.prepare(self._settings.state_dir) if choice == "control" else EngineExec()

    async def create(self, spec: SandboxSpec) -> Sandbox:
        if not self._reaped:
            self._reaped = True
            await self.reap_orphans()
        if spec.network == "host" and not self._settings.sandbox_allow_host_network:
            raise SandboxUnavailableError("network policy 'host' is not allowed by this server's operator")
        if spec.network == "llm" and spec.relay is None:
            raise SandboxError("network policy 'llm' needs a relay endpoint")
        transport = self._transport()
        creating = asyncio.ensure_future(call("create container", self._create_container, spec, transport))
        try:
            container_id = await asyncio.shield(creating)
        except BaseException:
            # Cancelled while the engine creates it: the container still appears, so remove it once it has.
            await asyncio.shield(self._discard(creating))
            await transport.close()
            raise
        engine, launcher = self._limits()
        box = DockerSandbox(container_id, transport, api=self.client().api, spec=spec, rlimits=launcher,
                            container_limits=engine, timeouts=self._config.timeouts, relay_port=self._config.relay_port)
        return await box.opened(box.start())

    async def _discard(self, creating: asyncio.Future[str]) -> None:
        try:
            container_id = await creating
        except BaseException:
            return  # never created
        await discard(self.client().api, container_id)

    def _create_container(self, spec: SandboxSpec, transport: DockerTransport) -> str:
        s, c = self._settings, self._config
        image = spec.image or c.image
        made = transport.container_spec(c.relay_port if spec.network == "llm" else None)
        volumes = {path: {"bind": path, "mode": "ro"} for path in c.host_binds}
        if spec.network == "llm":
            assert spec.relay is not None
            volumes[spec.relay.socket_path] = {"bind": RELAY_SOCKET, "mode": "rw"}
        if spec.agents_dir is not None:
            volumes[spec.agents_dir] = {"bind": AGENTS_DIR, "mode": "ro"}
        kwargs: dict[str, Any] = dict(
            image=image,
            command=made.command,
            labels={LABEL_ROLLOUT: spec.rollout_id, LABEL_OWNER: owner(), **made.labels},
            network_mode="host" if spec.network == "host" else "none",
            volumes={**volumes, **made.volumes},
            mem_limit=f"{s.sandbox_memory_mb}m",
            memswap_limit=f"{s.sandbox_memory_mb}m",
            pids_limit=s.sandbox_max_processes,
            nano_cpus=int(c.cpus * 1e9),
            cap_drop=["ALL"],
            cap_add=_CAPS,
            security_opt=["no-new-privileges"],
            user="0:0",
            working_dir="/",
            environment={},
        )
        # The low-level API: `containers.create` would inspect the new container (one more round trip).
        api = self.client().api
        try:
            return _create(api, kwargs)
        except docker.errors.ImageNotFound:
            self.client().images.pull(image)
            return _create(api, kwargs)

    async def reap_orphans(self) -> int:
        """Remove labelled containers whose owning server (on this host) is gone, with their host dirs."""
        return await call("reap containers", reap, self.client().api, self._settings.state_dir)

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await asyncio.to_thread(client.close)


def _create(api: Any, kwargs: dict[str, Any]) -> str:
    """Create a container with the SDK's own argument mapping; returns its id."""
    from docker.models.containers import _create_container_args

    return str(api.create_container(**_create_container_args(dict(kwargs, version=api._version)))["Id"])
