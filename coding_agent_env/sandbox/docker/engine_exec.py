"""The engine-exec transport: each command is a Docker exec (`exec_create`/`exec_start`/`exec_inspect`).

For any daemon, also one that does not share this host's filesystem: the machinery is copied in with
`put_archive` before the container starts (`SandboxLayout.machinery_tar`), and under network `llm` the forwarder is
started by an exec. The environment travels in the exec API's `environment`, never in an argv; a launcher
status file is read back through the archive API.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import docker.utils.socket as docker_socket
import requests.exceptions

from coding_agent_env.errors import SandboxError, SandboxFileNotFoundError, SandboxFileNotRegularError
from coding_agent_env.sandbox.docker.archive import Archive
from coding_agent_env.sandbox.docker.engine import call, close_attach_socket
from coding_agent_env.sandbox.docker.layout import DEFAULT, LAYOUT, RELAY_SOCKET, SandboxLayout
from coding_agent_env.sandbox.docker.transport import ContainerSpec, DockerTransport
from coding_agent_env.sandbox.launcher.client import OutputCap
from coding_agent_env.sandbox.launcher.transport import Ran

__all__ = ["EngineExec"]


_FORWARDER_READY_S = 10.0
_MACHINERY_FILE_MAX = 64 * 1024
"""The most read of one of the launcher's own files (a run's status: a few bytes of JSON)."""


class EngineExec(DockerTransport):
    """Commands of a container as engine execs (the container's, from `boot` on)."""

    name = "exec"

    def __init__(self) -> None:
        self._api: Any = None
        self._id = ""
        self._archive: Archive | None = None
        self._layout = DEFAULT

    def container_spec(self, forward_port: int | None, layout: SandboxLayout) -> ContainerSpec:
        self._layout = layout
        return ContainerSpec(LAYOUT.launcher_argv("init"))

    async def boot(self, api: Any, container_id: str, forward_port: int | None) -> None:
        self._api, self._id, self._archive = api, container_id, Archive(api, container_id)
        await self._archive.put("/", self._layout.machinery_tar(), what="prepare container")
        await call("start container", api.start, container_id)
        if forward_port is not None:
            await self._start_forwarder(forward_port)

    async def _start_forwarder(self, port: int) -> None:
        """`--detach` exits 0 once it listens (no readiness polling)."""
        argv = [LAYOUT.python, "-I", "-S", LAYOUT.forwarder, "--detach", RELAY_SOCKET, str(port)]
        out, err = OutputCap(0), OutputCap(64 * 1024)
        try:
            ran = await asyncio.wait_for(self.run(argv, env={}, uid=None, out=out, err=err), _FORWARDER_READY_S)
        except TimeoutError:
            raise SandboxError(f"the LLM forwarder did not listen within {_FORWARDER_READY_S:.0f} s") from None
        if ran.code != 0:
            raise SandboxError(f"the LLM forwarder did not start: {bytes(err.kept).decode(errors='replace')[-300:]}")

    async def run(self, argv: Sequence[str], *, env: Mapping[str, str], uid: int | None, out: OutputCap,
                  err: OutputCap, timeout: float | None = None, kill: bool = False) -> Ran:
        exec_id = await call("exec", self._create, argv, env, uid)
        return await self._finish(exec_id, out, err)

    async def start(self, argv: Sequence[str], *, env: Mapping[str, str], uid: int | None, out: OutputCap,
                    err: OutputCap) -> asyncio.Future[Ran]:
        # Created here, so a failure to create (the container is gone, say) is the caller's, not a later one.
        exec_id = await call("spawn", self._create, argv, env, uid)
        return asyncio.ensure_future(self._finish(exec_id, out, err))

    async def _finish(self, exec_id: str, out: OutputCap, err: OutputCap) -> Ran:
        await call("exec", self._drain, exec_id, out, err)
        try:
            info = await call("exec", self._api.exec_inspect, exec_id)
        except SandboxFileNotFoundError:
            return Ran(None)
        return Ran(info.get("ExitCode"))

    def _create(self, argv: Sequence[str], env: Mapping[str, str], uid: int | None) -> str:
        user = "0:0" if uid is None else f"{uid}:{uid}"
        created = self._api.exec_create(self._id, list(argv), environment=dict(env), user=user,
                                        workdir="/", stdout=True, stderr=True)
        return str(created["Id"])

    def _drain(self, exec_id: str, out: OutputCap, err: OutputCap) -> None:
        sock = self._api.exec_start(exec_id, socket=True)
        try:
            for stream_id, chunk in docker_socket.frames_iter(sock, tty=False):
                (out if stream_id == docker_socket.STDOUT else err).add(chunk)
        except (requests.exceptions.RequestException, OSError):
            pass  # the container went away under us (close during exec): reported by the exit code
        finally:
            close_attach_socket(sock)

    async def read_file(self, path: str) -> bytes:
        assert self._archive is not None, "read before boot"
        data, _ = await self._archive.read(path, _MACHINERY_FILE_MAX)
        if data is None:
            raise SandboxFileNotRegularError(f"{path!r} is not a regular file")
        return data
