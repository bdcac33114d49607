"""The Docker backend: one container per rollout, driven through the `docker` SDK (sync, run in threads).

Each sandbox is a container of the request's image (or `Settings.docker_image`), labelled with the rollout id
and the owning server (`host/pid`), with the network policy's network (`none` by default; `host` only when
`Settings.sandbox_allow_host_network`; `llm` = no network plus the relay's unix socket bind-mounted and the
LLM forwarder started inside once, so processes reach the relay at `relay_url`), a memory limit
(`sandbox_memory_mb`), a process limit (`sandbox_max_processes`) and a CPU quota (`docker_cpus`), all
capabilities dropped but the few its root-run launcher needs, and `no-new-privileges`.

Every command runs through the in-container launcher (`_launcher.py`, copied in at create): as uid 1000, in
its own session, under a child subreaper so the whole tree is killed at the timeout, on cancellation, or when
it exits. The environment travels through the exec API (`environment=`), never in an argv. Files go in and
out through the archive API (`put_archive`/`get_archive`), never through a shell. `close()` removes the
container (killing everything in it). Containers of a server that died are removed by `reap_orphans()`, run
before the first create.

Symlinks: a symlink at the path read is resolved (by the daemon, inside the container) and refused when it
leaves the sandbox roots; a symlinked *parent* directory is followed inside the container's own filesystem
(never the host's: the daemon confines it to the container root).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import socket
import tarfile
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, TypeVar

import docker
import docker.errors
import docker.utils.socket as docker_socket
import requests.exceptions

from coding_agent_env.errors import (
    SandboxError,
    SandboxFileError,
    SandboxFileNotFoundError,
    SandboxUnavailableError,
)
from coding_agent_env.pids import pid_alive
from coding_agent_env.sandbox import _docker_tar as tars
from coding_agent_env.sandbox import _inner
from coding_agent_env.sandbox._inner import SANDBOX_UID, InnerLayout, OutputCap
from coding_agent_env.sandbox.base import (
    BackendStatus,
    ExecResult,
    FileEntry,
    Process,
    Sandbox,
    SandboxBackend,
    SandboxPaths,
    SandboxSpec,
)
from coding_agent_env.settings import Settings

__all__ = ["DockerBackend", "DockerSandbox"]

T = TypeVar("T")

LABEL_ROLLOUT = "coding-agent-env.rollout"
LABEL_OWNER = "coding-agent-env.owner"
_PATHS = SandboxPaths(workdir="/workspace", home="/home/sandbox", tmp="/tmp", logs="/logs")
_LAYOUT = InnerLayout(base="/.coding-agent-env")
_RELAY_SOCKET = "/run/coding-agent-env-relay.sock"
_AGENTS_DIR = "/opt/coding-agent-env/agents"
_KILL_GRACE_S = 5.0
"""Host-side slack past a command's timeout before we kill its tree ourselves (the launcher normally does)."""
_FORWARDER_READY_S = 10.0
_CAPS = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETUID", "SETGID"]
"""Only the root-run launcher uses these; commands run as uid 1000 and have none."""
_KILLED_BY_CLOSE = -9
_GO_MODE_DIR = 1 << 31
"""`os.ModeDir` in the archive API's stat header (Go's FileMode)."""


def _close_attach_socket(sock: Any) -> None:
    """Close an exec attach socket for real. The SDK returns the `SocketIO` of an upgraded HTTP connection,
    whose close() leaves the socket itself open (a ResourceWarning later); docker>=7,<8 is pinned for this."""
    response = getattr(sock, "_response", None)
    if response is not None:
        response.close()
    raw = getattr(sock, "_sock", None)
    sock.close()
    if raw is not None:
        raw.close()


def _owner() -> str:
    return f"{socket.gethostname()}/{os.getpid()}"


def _translate(exc: Exception, what: str) -> SandboxError:
    """The one place Docker SDK and transport errors become our typed errors."""
    if isinstance(exc, docker.errors.ImageNotFound):
        return SandboxUnavailableError(f"{what}: image not found on the Docker daemon")
    if isinstance(exc, docker.errors.NotFound):
        return SandboxFileNotFoundError(f"{what}: not found")
    if isinstance(exc, requests.exceptions.ConnectionError | docker.errors.DockerException) and not isinstance(
        exc, docker.errors.APIError
    ):
        return SandboxUnavailableError(f"{what}: Docker daemon unreachable ({type(exc).__name__})")
    detail = exc.explanation if isinstance(exc, docker.errors.APIError) else str(exc)
    return SandboxError(f"{what}: {detail}")


_SDK_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException)


async def _call(what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    try:
        return await asyncio.to_thread(fn, *args, **kwargs)
    except _SDK_ERRORS as exc:
        raise _translate(exc, what) from exc


class DockerBackend(SandboxBackend):
    """Makes `DockerSandbox`es on the daemon at `Settings.docker_host`."""

    name = "docker"

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._client: docker.DockerClient | None = None
        self._reaped = False

    def _daemon_url(self) -> str:
        return self._settings.docker_host or "unix:///var/run/docker.sock"

    def client(self) -> docker.DockerClient:
        if self._client is None:
            self._client = docker.DockerClient(base_url=self._daemon_url())
        return self._client

    def check(self) -> BackendStatus:
        s = self._settings
        limits = _container_limits(s)
        socket_path = self._daemon_url().removeprefix("unix://")
        if self._daemon_url().startswith("unix://") and not os.path.exists(socket_path):
            return BackendStatus(self.name, False, None, f"no usable Docker daemon: no socket at {socket_path}", limits)
        try:
            version = self.client().version()
            present = bool(self.client().images.list(name=s.docker_image))
        except _SDK_ERRORS as exc:
            err = _translate(exc, "docker")
            return BackendStatus(self.name, False, None, f"no usable Docker daemon: {err}", limits)
        detail = f"Docker {version.get('Version', '?')}; default image {s.docker_image!r} "
        detail += "present" if present else "absent (pulled at the first rollout)"
        return BackendStatus(self.name, True, "docker", detail, limits)

    async def create(self, spec: SandboxSpec) -> Sandbox:
        if not self._reaped:
            self._reaped = True
            await self.reap_orphans()
        if spec.network == "host" and not self._settings.sandbox_allow_host_network:
            raise SandboxUnavailableError("network policy 'host' is not allowed by this server's operator")
        if spec.network == "llm" and spec.relay is None:
            raise SandboxError("network policy 'llm' needs a relay endpoint")
        image = spec.image or self._settings.docker_image
        container = await _call("create container", self._create_container, spec, image)
        box = DockerSandbox(self, container, spec)
        try:
            await box.start()
        except BaseException:
            await asyncio.shield(box.close())
            raise
        return box

    def _create_container(self, spec: SandboxSpec, image: str) -> Any:
        s = self._settings
        volumes = {path: {"bind": path, "mode": "ro"} for path in s.docker_host_binds}
        if spec.network == "llm":
            assert spec.relay is not None
            volumes[spec.relay.socket_path] = {"bind": _RELAY_SOCKET, "mode": "rw"}
        if spec.agents_dir is not None:
            volumes[spec.agents_dir] = {"bind": _AGENTS_DIR, "mode": "ro"}
        kwargs: dict[str, Any] = dict(
            image=image,
            command=_LAYOUT.launcher_argv("init"),
            labels={LABEL_ROLLOUT: spec.rollout_id, LABEL_OWNER: _owner()},
            network_mode="host" if spec.network == "host" else "none",
            volumes=volumes,
            mem_limit=f"{s.sandbox_memory_mb}m",
            memswap_limit=f"{s.sandbox_memory_mb}m",
            pids_limit=s.sandbox_max_processes,
            nano_cpus=int(s.docker_cpus * 1e9),
            cap_drop=["ALL"],
            cap_add=_CAPS,
            security_opt=["no-new-privileges"],
            user="0:0",
            working_dir="/",
            environment={},
        )
        try:
            return self.client().containers.create(**kwargs)
        except docker.errors.ImageNotFound:
            self.client().images.pull(image)
            return self.client().containers.create(**kwargs)

    async def reap_orphans(self) -> int:
        """Remove labelled containers whose owning server (on this host) is gone."""
        return await _call("reap containers", self._reap)

    def _reap(self) -> int:
        host = socket.gethostname()
        reaped = 0
        for container in self.client().containers.list(all=True, filters={"label": LABEL_ROLLOUT}):
            owner_host, _, pid = container.labels.get(LABEL_OWNER, "").rpartition("/")
            if owner_host != host or not pid.isdigit() or pid_alive(int(pid)):
                continue
            try:
                container.remove(force=True, v=True)
                reaped += 1
            except docker.errors.NotFound:
                pass
        return reaped


def _container_limits(s: Settings) -> dict[str, int]:
    """What `_create_container` asks the engine for, plus the rlimits the launcher sets on every command."""
    return {"memory": s.sandbox_memory_mb * 1024 * 1024, "pids": s.sandbox_max_processes,
            "nano_cpus": int(s.docker_cpus * 1e9), **_inner.rlimits(s)}


class DockerSandbox(Sandbox):
    """See the module docstring. Built only by `DockerBackend.create`."""

    backend = "docker"
    isolation = "docker"

    def __init__(self, backend: DockerBackend, container: Any, spec: SandboxSpec) -> None:
        super().__init__()
        self._backend = backend
        self._settings = backend._settings
        self._api = backend.client().api
        self._container = container
        self._spec = spec
        self.id = container.id
        self.paths = _PATHS
        self._limits = _inner.rlimit_args(self._settings)
        self.limits = MappingProxyType(_container_limits(self._settings))
        self.network = spec.network
        if spec.network == "llm":
            self.relay_url = f"http://127.0.0.1:{self._settings.docker_relay_port}/v1"
        if spec.agents_dir is not None:
            self.agents_dir = _AGENTS_DIR

    async def start(self) -> None:
        """Copy the machinery in, start the container, and the forwarder under network `llm`."""
        await _call("prepare container", self._container.put_archive, "/", _machinery_tar())
        await _call("start container", self._container.start)
        if self._spec.network == "llm":
            await self._start_forwarder()

    async def _start_forwarder(self) -> None:
        port = str(self._settings.docker_relay_port)
        argv = [_LAYOUT.python, _LAYOUT.forwarder, _RELAY_SOCKET, port]
        exec_id = await _call("start forwarder", self._exec_create, argv, {}, "0:0")
        await _call("start forwarder", self._api.exec_start, exec_id, detach=True)
        probe = (
            "import socket,sys,time\n"
            f"end=time.monotonic()+{_FORWARDER_READY_S}\n"
            "while True:\n"
            f"    try: socket.create_connection(('127.0.0.1',{port}),1).close(); break\n"
            "    except OSError:\n"
            "        if time.monotonic()>end: sys.exit(1)\n"
            "        time.sleep(0.01)\n"
        )
        code, _, err = await self._small([_LAYOUT.python, "-c", probe], user="0:0")
        if code != 0:
            raise SandboxError(f"the LLM forwarder did not start: {err.decode(errors='replace')[-300:]}")

    def _exec_create(self, argv: Sequence[str], env: Mapping[str, str], user: str) -> str:
        created = self._api.exec_create(self._container.id, list(argv), environment=dict(env), user=user,
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
            _close_attach_socket(sock)

    async def _small(self, argv: Sequence[str], *, user: str = f"{SANDBOX_UID}:{SANDBOX_UID}") -> tuple[int | None, bytes, bytes]:
        """Run a short machinery command to completion (no launcher)."""
        out, err = OutputCap(16 * 1024 * 1024), OutputCap(64 * 1024)
        exec_id = await _call("exec", self._exec_create, argv, {}, user)
        await _call("exec", self._drain, exec_id, out, err)
        info = await _call("exec", self._api.exec_inspect, exec_id)
        return info.get("ExitCode"), bytes(out.kept), bytes(err.kept)

    async def exec(
        self,
        argv: Sequence[str],
        *,
        timeout: float,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        fresh: bool = False,
        max_output_bytes: int,
    ) -> ExecResult:
        self._check_open()
        full_env = self.base_env() | dict(env or {})
        _inner.check_env(full_env)
        token = _inner.new_token()
        command = _inner.run_argv(_LAYOUT, argv, token=token, cwd=cwd or self.paths.workdir, timeout=timeout,
                                  env_keys=list(full_env), fresh=fresh, limits=self._limits)
        loop = asyncio.get_running_loop()
        started = loop.time()
        exec_id = await _call("exec", self._exec_create, command, full_env, "0:0")
        out, err = OutputCap(max_output_bytes), OutputCap(max_output_bytes)
        drain = asyncio.ensure_future(_call("exec", self._drain, exec_id, out, err))
        try:
            await asyncio.wait_for(asyncio.shield(drain), timeout + _KILL_GRACE_S)
        except TimeoutError:
            await self._kill_run(token)
            await drain
        except BaseException:
            await asyncio.shield(self._kill_run(token))
            await asyncio.shield(drain)
            raise
        code, timed_out = await self._exit_status(exec_id, token)
        return ExecResult(code, bytes(out.kept), bytes(err.kept), loop.time() - started, timed_out,
                          out.dropped, err.dropped)

    async def _exit_status(self, exec_id: str, token: str) -> tuple[int | None, bool]:
        if self.closed:
            return _KILLED_BY_CLOSE, False
        try:
            info = await _call("exec", self._api.exec_inspect, exec_id)
        except SandboxFileNotFoundError:
            return _KILLED_BY_CLOSE, False
        code = info.get("ExitCode")
        if code is None or code < 128:
            return code, False
        try:
            raw = await self._read(_LAYOUT.status_path(token), None, False)
        except SandboxFileNotFoundError:
            return code, False
        return _inner.parse_status(raw)

    async def _kill_run(self, token: str) -> None:
        """Kill a launcher's whole tree (it is gone afterwards); a closed sandbox has nothing left to kill."""
        if self.closed:
            return
        try:
            await self._small(_LAYOUT.launcher_argv("kill", "--token", token, "--run-dir", _LAYOUT.run_dir), user="0:0")
        except SandboxError:
            if not self.closed:
                raise

    async def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        log_path: str | None = None,
    ) -> Process:
        self._check_open()
        full_env = self.base_env() | dict(env or {})
        _inner.check_env(full_env)
        log = _inner.confine(self.paths, log_path)[1] if log_path else "/dev/null"
        token = _inner.new_token()
        command = _inner.run_argv(_LAYOUT, argv, token=token, cwd=cwd or self.paths.workdir, timeout=None,
                                  env_keys=list(full_env), limits=self._limits, log_path=log)
        exec_id = await _call("spawn", self._exec_create, command, full_env, "0:0")
        sink = OutputCap(0)
        task = asyncio.ensure_future(_call("spawn", self._drain, exec_id, sink, sink))
        return DockerProcess(self, exec_id, token, task)

    # -- files -----------------------------------------------------------------------------------------

    async def _read(self, full: str, max_bytes: int | None, tail: bool) -> bytes:
        def fetch() -> tuple[bytes | None, dict[str, Any]]:
            stream, stat = self._container.get_archive(full, chunk_size=64 * 1024)
            try:
                if stat.get("linkTarget") or stat.get("mode", 0) & _GO_MODE_DIR:
                    return None, stat
                return tars.read_member(iter(stream), max_bytes, tail), stat
            finally:
                getattr(stream, "close", lambda: None)()

        data, stat = await _call(f"read {full!r}", fetch)
        if data is not None:
            return data
        target = stat.get("linkTarget")
        if target:
            if not _inner.inside(self.paths, target):
                raise SandboxFileError(f"{full!r} resolves outside the sandbox")
            return await self._read(target, max_bytes, tail)
        raise SandboxFileError(f"{full!r} is not a regular file")

    async def read_bytes(self, path: str, *, max_bytes: int | None = None, tail: bool = False) -> bytes:
        self._check_open()
        _, full = _inner.confine(self.paths, path)
        try:
            return await self._read(full, max_bytes, tail)
        except SandboxFileNotFoundError as exc:
            raise SandboxFileNotFoundError(f"no such file in the sandbox: {path!r}") from exc

    async def write_bytes(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        self._check_open()
        root, full = _inner.confine(self.paths, path)
        rel = tars.split_root(root, full)
        if not rel:
            raise SandboxFileError(f"cannot write over the directory {path!r}")
        payload = tars.file_tar(rel, data, mode=mode, uid=SANDBOX_UID)
        await _call(f"write {path!r}", self._container.put_archive, root, payload)

    async def mkdir(self, path: str) -> None:
        self._check_open()
        root, full = _inner.confine(self.paths, path)
        rel = tars.split_root(root, full)
        if rel:
            await _call(f"mkdir {path!r}", self._container.put_archive, root, tars.dir_entries_tar([rel], SANDBOX_UID))

    async def remove(self, path: str) -> None:
        self._check_open()
        root, full = _inner.confine(self.paths, path)
        if full == root:
            raise SandboxFileError(f"refusing to remove the root {path!r}")
        code, _, err = await self._small(["rm", "-rf", "--", full])
        if code != 0:
            raise SandboxFileError(f"cannot remove {path!r}: {err.decode(errors='replace').strip()[-200:]}")

    async def list_files(self, path: str, *, max_entries: int) -> tuple[list[FileEntry], bool]:
        self._check_open()
        _, full = _inner.confine(self.paths, path)
        code, out, err = await self._small(_LAYOUT.launcher_argv("stat", full))
        info = json.loads(out or b"{}")
        if info.get("real") is None:
            raise SandboxFileNotFoundError(f"no such directory in the sandbox: {path!r}")
        if not _inner.inside(self.paths, info["real"]) or info.get("kind") != "dir":
            raise SandboxFileError(f"{path!r} is not a directory inside the sandbox")
        code, out, err = await self._small(_LAYOUT.launcher_argv("list", info["real"], str(max_entries)))
        if code != 0:
            raise SandboxFileError(f"cannot list {path!r}: {err.decode(errors='replace')[-200:]}")
        listing = json.loads(out)
        return [FileEntry(p, k, s) for p, k, s in listing["entries"]], bool(listing["cut"])

    async def _close(self) -> None:
        try:
            await _call("remove container", self._container.remove, force=True, v=True)
        except SandboxFileNotFoundError:
            pass  # already gone


def _machinery_tar() -> bytes:
    """The launcher, the forwarder, its run/fresh dirs (root-only) and the sandbox's own directories."""
    buf = io.BytesIO()
    base = _LAYOUT.base.lstrip("/")
    dirs = {base: (0, 0o755), f"{base}/run": (0, 0o700), f"{base}/fresh": (0, 0o711)}
    for path in (_PATHS.workdir, _PATHS.home, _PATHS.logs):
        parts = path.strip("/").split("/")
        for i in range(len(parts) - 1):
            dirs.setdefault("/".join(parts[: i + 1]), (0, 0o755))
        dirs["/".join(parts)] = (SANDBOX_UID, 0o755)
    dirs["tmp"] = (0, 0o1777)
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, (uid, mode) in dirs.items():
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, mode, uid, uid
            tar.addfile(info)
        for name, data in ((f"{base}/launcher.py", _inner.launcher_source()),
                           (f"{base}/forwarder.py", _inner.forwarder_source())):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class DockerProcess(Process):
    """A background command in a Docker sandbox; `kill()` kills its launcher's whole tree."""

    def __init__(self, box: DockerSandbox, exec_id: str, token: str, task: asyncio.Future[None]) -> None:
        self._box = box
        self._exec_id = exec_id
        self._token = token
        self._task = task
        self._code: int | None = None

    @property
    def returncode(self) -> int | None:
        return self._code

    async def wait(self) -> int:
        if self._code is None:
            await asyncio.shield(self._task)
            code, _ = await self._box._exit_status(self._exec_id, self._token)
            self._code = code if code is not None else _KILLED_BY_CLOSE
        return self._code

    async def kill(self) -> None:
        if self._code is None:
            await asyncio.shield(self._box._kill_run(self._token))
            await asyncio.shield(self.wait())
