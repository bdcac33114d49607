"""The Docker backend: one container per rollout, driven through the `docker` SDK (sync, run in threads).

Each sandbox is a container of the request's image (or `Settings.docker_image`), labelled with the rollout id
and the owning server (`host/pid`), with the network policy's network (`none` by default; `host` only when
`Settings.sandbox_allow_host_network`; `llm` = no network plus the relay's unix socket bind-mounted and the
LLM forwarder started inside once, so processes reach the relay at `relay_url`), a memory limit
(`sandbox_memory_mb`), a process limit (`sandbox_max_processes`) and a CPU quota (`docker_cpus`), all
capabilities dropped but the few its root-run launcher needs, and `no-new-privileges`.

Every command runs through the in-container launcher (`_launcher.py`): as uid 1000, in its own session, under
a child subreaper so the whole tree is killed at the timeout, on cancellation, or when it exits. How commands
reach the launcher depends on where the daemon is:

- a daemon on this host (a `unix://` DOCKER_HOST, the usual case, and the one network `llm` needs anyway):
  a per-container host directory (`<state_dir>/<pid>-docker-<hex>`, 0700) holding the launcher, the
  forwarder and a one-shot SOCK_SEQPACKET listener is bind-mounted read-only; the container's PID 1
  (`launcher.py init --ctl`) makes the sandbox directories, starts the forwarder under `llm`, then connects
  to that listener (the connection is the readiness signal; the listener is then closed and unlinked, before
  any sandbox command exists). Each command is a message on that connection carrying three socket fds
  (request/reply, stdout, stderr): PID 1 forks, no engine exec, no new interpreter. Nothing is copied in.
  Sends are serialised (one asyncio.Lock per sandbox) and bounded (`_SEND_S`). A kill is handled by PID 1
  itself, without forking, so an agent that fills the pids limit can still be killed; a command PID 1 could
  not fork for gets no reply and ends with exit code `_NO_REPLY_CODE` and a note on stderr. A malformed
  reply (the image, and so the python3 that runs PID 1, is the caller's) or a reply that does not come
  (`_REPLY_S` after a kill, `_MACHINERY_S` for machinery) is a `SandboxError`.
- any other daemon: the machinery is copied in with `put_archive` before start and each command is an
  engine exec (`exec_create`/`exec_start`/`exec_inspect`).

Either way the environment travels outside any argv (the request socket, or the exec API's `environment=`).
Files go in and out through the archive API (`put_archive`/`get_archive`), never through a shell; `remove()`
runs as root through the launcher's `remove` mode, which follows no symlink below the sandbox root. `close()`
removes the container (killing everything in it) and its host directory. Containers of a server that died
are removed, with their host directories, by `reap_orphans()`, run before the first create.

Symlinks: a symlink at the path read is resolved (by the daemon, inside the container) and refused when it
leaves the sandbox roots; a symlinked *parent* directory is followed inside the container's own filesystem
(never the host's: the daemon confines it to the container root).
"""

from __future__ import annotations

import asyncio
import errno
import io
import json
import os
import secrets
import shutil
import socket
import tarfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
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
LABEL_HOSTDIR = "coding-agent-env.hostdir"
_PATHS = SandboxPaths(workdir="/workspace", home="/home/sandbox", tmp="/tmp", logs="/logs")
_LAYOUT = InnerLayout(base="/.coding-agent-env", code="/.coding-agent-env/code")
_RELAY_SOCKET = "/run/coding-agent-env-relay.sock"
_AGENTS_DIR = "/opt/coding-agent-env/agents"
_KILL_GRACE_S = 5.0
"""Host-side slack past a command's timeout before we kill its tree ourselves (the launcher normally does)."""
_FORWARDER_READY_S = 10.0
_INIT_READY_S = 30.0
"""How long PID 1 may take to report ready (directories, forwarder) before create fails."""
_SOCKET_PATH_MAX = 100
"""`sun_path` holds 108 bytes: a longer control socket path falls back to the engine-exec mode."""
_CAPS = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETUID", "SETGID"]
"""Only the root-run launcher uses these; commands run as uid 1000 and have none."""
_KILLED_BY_CLOSE = -9
_NO_REPLY_CODE = 126
"""Exit code of a command PID 1 never answered for: it could not fork (the pids limit is full) or the
command's runner died; stderr says so."""
_SEND_S = 30.0
"""How long a control message may wait for room in PID 1's queue."""
_REPLY_S = 30.0
"""How long PID 1 may take to answer a kill, or a killed command to finish, before the sandbox is broken."""
_MACHINERY_S = 300.0
"""Deadline of a machinery command (stat, list, remove, probes): past it the sandbox is broken."""
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

    def _local_daemon(self) -> bool:
        """Whether the daemon shares this host's filesystem (so host paths can be bind-mounted)."""
        return self._daemon_url().startswith("unix://")

    async def create(self, spec: SandboxSpec) -> Sandbox:
        if not self._reaped:
            self._reaped = True
            await self.reap_orphans()
        if spec.network == "host" and not self._settings.sandbox_allow_host_network:
            raise SandboxUnavailableError("network policy 'host' is not allowed by this server's operator")
        if spec.network == "llm" and spec.relay is None:
            raise SandboxError("network policy 'llm' needs a relay endpoint")
        image = spec.image or self._settings.docker_image
        ctl = _HostDir.make(self._settings) if self._local_daemon() else None
        creating = asyncio.ensure_future(_call("create container", self._create_container, spec, image, ctl))
        try:
            container = await asyncio.shield(creating)
        except BaseException:
            # Cancelled while the engine creates it: the container still appears, so remove it once it has.
            await asyncio.shield(self._discard(creating))
            if ctl is not None:
                ctl.remove()
            raise
        box = DockerSandbox(self, container, spec, ctl)
        try:
            await box.start()
        except BaseException:
            await asyncio.shield(box.close())
            raise
        return box

    async def _discard(self, creating: asyncio.Future[str]) -> None:
        try:
            container_id = await creating
        except BaseException:
            return  # never created
        try:
            await _call("remove container", self.client().api.remove_container, container_id, force=True, v=True)
        except SandboxError:
            pass  # gone already, or left to the reaper

    def _create_container(self, spec: SandboxSpec, image: str, ctl: _HostDir | None) -> Any:
        s = self._settings
        volumes = {path: {"bind": path, "mode": "ro"} for path in s.docker_host_binds}
        if spec.network == "llm":
            assert spec.relay is not None
            volumes[spec.relay.socket_path] = {"bind": _RELAY_SOCKET, "mode": "rw"}
        if spec.agents_dir is not None:
            volumes[spec.agents_dir] = {"bind": _AGENTS_DIR, "mode": "ro"}
        labels = {LABEL_ROLLOUT: spec.rollout_id, LABEL_OWNER: _owner()}
        command = _LAYOUT.launcher_argv("init")
        if ctl is not None:
            # -I -S: PID 1's start-up is on every create's path; it needs neither site nor PYTHON* variables.
            command = [_LAYOUT.python, "-I", "-S", _LAYOUT.launcher, "init"]
            labels[LABEL_HOSTDIR] = str(ctl.path)
            # One read-only mount: the code, and the control listener (connecting needs no writable mount).
            volumes[str(ctl.path)] = {"bind": _LAYOUT.code, "mode": "ro"}
            command += ["--dirs", _sandbox_dirs(), "--ctl", f"{_LAYOUT.code}/{_HostDir.SOCKET}"]
            if spec.network == "llm":
                command += ["--forward-socket", _RELAY_SOCKET, "--forward-port", str(s.docker_relay_port)]
        kwargs: dict[str, Any] = dict(
            image=image,
            command=command,
            labels=labels,
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
        # The low-level API: `containers.create` would inspect the new container (one more round trip).
        api = self.client().api
        try:
            return _create(api, kwargs)
        except docker.errors.ImageNotFound:
            self.client().images.pull(image)
            return _create(api, kwargs)

    async def reap_orphans(self) -> int:
        """Remove labelled containers whose owning server (on this host) is gone, with their host dirs."""
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
            hostdir = container.labels.get(LABEL_HOSTDIR)
            # Only a directory this backend makes (under our state dir, named for the dead server): a label
            # is just a string, and must not steer a recursive removal anywhere else.
            if (hostdir and os.path.dirname(hostdir) == str(self._settings.state_dir)
                    and os.path.basename(hostdir).startswith(f"{pid}-docker-")):
                shutil.rmtree(hostdir, ignore_errors=True)
        return reaped


def _create(api: Any, kwargs: dict[str, Any]) -> str:
    """Create a container with the SDK's own argument mapping; returns its id."""
    from docker.models.containers import _create_container_args

    return str(api.create_container(**_create_container_args(dict(kwargs, version=api._version)))["Id"])


def _sandbox_dirs() -> str:
    """What PID 1 makes at start, in `init --dirs` form: `PATH:UID:OCTAL_MODE,...`."""
    dirs = [(_LAYOUT.run_dir, 0, 0o700), (_LAYOUT.fresh_dir, 0, 0o711), ("/tmp", 0, 0o1777)]
    dirs += [(path, SANDBOX_UID, 0o755) for path in (_PATHS.workdir, _PATHS.home, _PATHS.logs)]
    return ",".join(f"{path}:{uid}:{mode:o}" for path, uid, mode in dirs)


class _HostDir:
    """A container's host directory (local daemon only), bound read-only at `_LAYOUT.code`: the launcher and
    forwarder files, and the one-shot control listener (see the module docstring). Owned by this server
    process (`<pid>-docker-<hex>` under the state dir), so both reapers can remove it after a crash."""

    SOCKET = "ctl.sock"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.listener: socket.socket | None = None

    @classmethod
    def make(cls, settings: Settings) -> _HostDir | None:
        """A fresh host dir with its listener bound, or None when the socket path would be too long."""
        state = settings.state_dir
        path = state / f"{os.getpid()}-docker-{secrets.token_hex(6)}"
        if len(str(path / cls.SOCKET)) > _SOCKET_PATH_MAX:
            return None
        state.mkdir(parents=True, exist_ok=True)
        box = cls(path)
        try:
            path.mkdir(mode=0o700)
            (path / "launcher.py").write_bytes(_inner.launcher_source())
            (path / "forwarder.py").write_bytes(_inner.forwarder_source())
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            box.listener = listener
            listener.bind(str(path / cls.SOCKET))
            listener.listen(1)
            listener.setblocking(False)
        except OSError as exc:
            box.remove()
            raise SandboxError(f"cannot prepare the container's host directory: {exc.strerror}") from exc
        return box

    def close_listener(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None
            (self.path / self.SOCKET).unlink(missing_ok=True)

    def remove(self) -> None:
        self.close_listener()
        shutil.rmtree(self.path, ignore_errors=True)


def _container_limits(s: Settings) -> dict[str, int]:
    """What `_create_container` asks the engine for, plus the rlimits the launcher sets on every command."""
    return {"memory": s.sandbox_memory_mb * 1024 * 1024, "pids": s.sandbox_max_processes,
            "nano_cpus": int(s.docker_cpus * 1e9), **_inner.rlimits(s)}


class DockerSandbox(Sandbox):
    """See the module docstring. Built only by `DockerBackend.create`."""

    backend = "docker"
    isolation = "docker"

    def __init__(self, backend: DockerBackend, container_id: str, spec: SandboxSpec, host: _HostDir | None) -> None:
        super().__init__()
        self._backend = backend
        self._settings = backend._settings
        self._api = backend.client().api
        self._spec = spec
        self._host = host
        self._ctl: socket.socket | None = None
        self._sender: _CtlSender | None = None
        self.id = container_id
        self.paths = _PATHS
        self._limits = _inner.rlimit_args(self._settings)
        self.limits = MappingProxyType(_container_limits(self._settings))
        self.network = spec.network
        if spec.network == "llm":
            self.relay_url = f"http://127.0.0.1:{self._settings.docker_relay_port}/v1"
        if spec.agents_dir is not None:
            self.agents_dir = _AGENTS_DIR

    async def start(self) -> None:
        """Start the container; ready once its directories exist (and the forwarder listens under `llm`)."""
        if self._host is None:
            await _call("prepare container", self._api.put_archive, self.id, "/", _machinery_tar())
            await _call("start container", self._api.start, self.id)
            if self._spec.network == "llm":
                await self._start_forwarder()
            return
        await _call("start container", self._api.start, self.id)
        await self._accept_init()

    async def _accept_init(self) -> None:
        """Wait for PID 1 to connect to the control listener (checking now and then that it still runs)."""
        assert self._host is not None and self._host.listener is not None
        loop = asyncio.get_running_loop()
        accept = asyncio.ensure_future(loop.sock_accept(self._host.listener))
        end = loop.time() + _INIT_READY_S
        try:
            while True:
                done, _ = await asyncio.wait([accept], timeout=0.5)
                if done:
                    break
                state = (await _call("inspect container", self._api.inspect_container, self.id))["State"]
                if not state.get("Running") or loop.time() > end:
                    logs = await _call("container logs", self._api.logs, self.id, tail=20)
                    why = "exited" if not state.get("Running") else f"is not ready after {_INIT_READY_S:.0f} s"
                    raise SandboxError(f"the container's init {why}: {logs.decode(errors='replace')[-500:]}")
        finally:
            if not accept.done():
                accept.cancel()
            self._host.close_listener()
        conn, _ = accept.result()
        conn.setblocking(False)
        self._ctl = conn
        self._sender = _CtlSender(conn)
        try:
            hello = await asyncio.wait_for(loop.sock_recv(conn, 4096), _INIT_READY_S)
        except (TimeoutError, OSError):
            hello = b""
        error = _parse_hello(hello)
        if error:
            raise SandboxError(f"the container's init failed: {error}")

    async def _start_forwarder(self) -> None:
        """Engine-exec mode only (in control mode PID 1 starts it): `--detach` exits 0 once it listens."""
        argv = [_LAYOUT.python, "-I", "-S", _LAYOUT.forwarder, "--detach", _RELAY_SOCKET,
                str(self._settings.docker_relay_port)]
        try:
            code, _, err = await asyncio.wait_for(self._small(argv, uid=None), _FORWARDER_READY_S)
        except TimeoutError:
            raise SandboxError(f"the LLM forwarder did not listen within {_FORWARDER_READY_S:.0f} s") from None
        if code != 0:
            raise SandboxError(f"the LLM forwarder did not start: {err.decode(errors='replace')[-300:]}")

    # -- running machinery: through PID 1's control socket, or engine execs ----------------------------------

    async def _run(self, argv: Sequence[str], env: Mapping[str, str], uid: int | None,
                   out: OutputCap, err: OutputCap, *, kill: bool = False,
                   deadline: float | None = None) -> tuple[int | None, str | None]:
        """Run `argv` to completion as `uid` (None: root): (exit code or None when the container went away,
        the launcher's status JSON when PID 1 passed it back). Output goes to the caps. `kill`: a launcher
        `kill`, which PID 1 runs itself (no fork). Past `deadline` seconds: SandboxError."""
        if self._ctl is None:
            user = "0:0" if uid is None else f"{uid}:{uid}"
            exec_id = await _call("exec", self._exec_create, argv, env, user)
            await _call("exec", self._drain, exec_id, out, err)
            try:
                info = await _call("exec", self._api.exec_inspect, exec_id)
            except SandboxFileNotFoundError:
                return None, None
            return info.get("ExitCode"), None
        if deadline is None:
            return await self._ctl_run(argv, env, uid, out, err, kill=kill)
        try:
            async with asyncio.timeout(deadline):
                return await self._ctl_run(argv, env, uid, out, err, kill=kill)
        except TimeoutError:
            raise SandboxError(f"the container's init did not answer within {deadline:.0f} s") from None

    async def _ctl_run(self, argv: Sequence[str], env: Mapping[str, str], uid: int | None,
                       out: OutputCap, err: OutputCap, *, kill: bool = False) -> tuple[int | None, str | None]:
        assert self._sender is not None
        loop = asyncio.get_running_loop()
        pairs = [socket.socketpair() for _ in range(3)]
        try:
            try:
                await self._sender.send(b"k" if kill else b"r", [theirs.fileno() for _, theirs in pairs])
            except OSError:
                return None, None  # PID 1 is gone: the container was removed
            finally:
                for _, theirs in pairs:
                    theirs.close()
            chan, out_sock, err_sock = (ours for ours, _ in pairs)
            for sock in (chan, out_sock, err_sock):
                sock.setblocking(False)
            request = json.dumps({"argv": list(argv), "env": dict(env), "uid": uid}).encode()
            try:
                await loop.sock_sendall(chan, request)
                chan.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # the child died before reading: reported below as no reply
            await asyncio.gather(_pump(loop, out_sock, out), _pump(loop, err_sock, err))
            reply = OutputCap(64 * 1024)
            await _pump(loop, chan, reply)
        finally:
            for ours, _ in pairs:
                ours.close()
        if not reply.kept:
            if self.closed:
                return None, None
            # PID 1 could not fork (pids limit full) or the runner died: the command did not run to its end.
            err.add(b"\nsandbox: no reply from the container's init (no process could be started, or the "
                    b"command's runner died)\n")
            return _NO_REPLY_CODE, None
        return _parse_reply(bytes(reply.kept))

    def _exec_create(self, argv: Sequence[str], env: Mapping[str, str], user: str) -> str:
        created = self._api.exec_create(self.id, list(argv), environment=dict(env), user=user,
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

    async def _small(self, argv: Sequence[str], *, uid: int | None = SANDBOX_UID) -> tuple[int | None, bytes, bytes]:
        """Run a short machinery command to completion (no launcher `run`)."""
        out, err = OutputCap(16 * 1024 * 1024), OutputCap(64 * 1024)
        code, _ = await self._run(argv, {}, uid, out, err, deadline=_MACHINERY_S)
        return code, bytes(out.kept), bytes(err.kept)

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
        out, err = OutputCap(max_output_bytes), OutputCap(max_output_bytes)
        run = asyncio.ensure_future(self._run(command, full_env, None, out, err))
        try:
            await asyncio.wait_for(asyncio.shield(run), timeout + _KILL_GRACE_S)
        except TimeoutError:
            await self._kill_run(token)
            await self._settle(run)
        except BaseException:
            await asyncio.shield(self._abort(run, token))
            raise
        code, timed_out = await self._exit_status(run.result(), token)
        return ExecResult(code, bytes(out.kept), bytes(err.kept), loop.time() - started, timed_out,
                          out.dropped, err.dropped)

    async def _exit_status(self, ran: tuple[int | None, str | None], token: str) -> tuple[int | None, bool]:
        code, status = ran
        if self.closed or code is None:
            return _KILLED_BY_CLOSE, False
        if code < 128:
            return code, False
        if status is not None:
            return _inner.parse_status(status.encode())
        if self._ctl is not None:
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
        argv = _LAYOUT.launcher_argv("kill", "--token", token, "--run-dir", _LAYOUT.run_dir)
        try:
            await self._run(argv, {}, None, OutputCap(0), OutputCap(0), kill=True, deadline=_REPLY_S)
        except SandboxError:
            if not self.closed:
                raise

    async def _settle(self, run: asyncio.Future[Any]) -> None:
        """Wait (bounded) for a killed command's run to finish; a sandbox where it does not is broken."""
        done, _ = await asyncio.wait([run], timeout=_REPLY_S)
        if not done:
            run.cancel()
            await asyncio.wait([run])
            raise SandboxError(f"a killed command did not finish within {_REPLY_S:.0f} s")

    async def _abort(self, run: asyncio.Future[Any], token: str) -> None:
        """Kill and settle a command whose caller went away (errors here are dropped: the caller's stands)."""
        try:
            await self._kill_run(token)
            await self._settle(run)
        except SandboxError:
            run.cancel()
            await asyncio.wait([run])

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
        sink = OutputCap(0)
        if self._ctl is None:  # keep the engine-exec error surface: a failed exec_create raises here
            exec_id = await _call("spawn", self._exec_create, command, full_env, "0:0")

            async def ran() -> tuple[int | None, str | None]:
                await _call("spawn", self._drain, exec_id, sink, sink)
                try:
                    return (await _call("spawn", self._api.exec_inspect, exec_id)).get("ExitCode"), None
                except SandboxFileNotFoundError:
                    return None, None

            task = asyncio.ensure_future(ran())
        else:
            task = asyncio.ensure_future(self._ctl_run(command, full_env, None, sink, sink))
        return DockerProcess(self, token, task)

    # -- files -----------------------------------------------------------------------------------------

    async def _read(self, full: str, max_bytes: int | None, tail: bool) -> bytes:
        def fetch() -> tuple[bytes | None, dict[str, Any]]:
            stream, stat = self._api.get_archive(self.id, full, chunk_size=64 * 1024)
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
        await _call(f"write {path!r}", self._api.put_archive, self.id, root, payload)

    async def mkdir(self, path: str) -> None:
        self._check_open()
        root, full = _inner.confine(self.paths, path)
        rel = tars.split_root(root, full)
        if rel:
            payload = tars.dir_entries_tar([rel], SANDBOX_UID)
            await _call(f"mkdir {path!r}", self._api.put_archive, self.id, root, payload)

    async def remove(self, path: str) -> None:
        self._check_open()
        root, full = _inner.confine(self.paths, path)
        if full == root:
            raise SandboxFileError(f"refusing to remove the root {path!r}")
        # As root (an agent's mode-000 directory must not make verify's removal fail), through the launcher,
        # which follows no symlink below `root` (root's removal must not be redirected by one).
        code, _, err = await self._small(_LAYOUT.launcher_argv("remove", full, root), uid=None)
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
            await _call("remove container", self._api.remove_container, self.id, force=True, v=True)
        except SandboxFileNotFoundError:
            pass  # already gone
        finally:
            if self._sender is not None:
                self._sender.close()
            elif self._ctl is not None:
                self._ctl.close()
            if self._host is not None:
                self._host.remove()


def _machinery_tar() -> bytes:
    """The launcher, the forwarder, its run/fresh dirs (root-only) and the sandbox's own directories."""
    buf = io.BytesIO()
    base = _LAYOUT.base.lstrip("/")
    code = _LAYOUT.code.lstrip("/") if _LAYOUT.code else base
    dirs = {base: (0, 0o755), code: (0, 0o755), f"{base}/run": (0, 0o700), f"{base}/fresh": (0, 0o711)}
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
        for name, data in ((f"{code}/launcher.py", _inner.launcher_source()),
                           (f"{code}/forwarder.py", _inner.forwarder_source())):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class _CtlSender:
    """Sends control messages on PID 1's socket, one at a time (an asyncio.Lock: a socket has one writer
    callback in the loop, so two waiting senders would lose one wake-up), each within `_SEND_S`. `close()`
    during a send wakes it with an OSError (read as "PID 1 is gone")."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.closed = False
        self._lock = asyncio.Lock()
        self._waiter: asyncio.Future[None] | None = None

    async def send(self, msg: bytes, fds: list[int], timeout: float = _SEND_S) -> None:
        """One message carrying `fds` (SOCK_SEQPACKET: atomic). OSError: closed; SandboxError: timed out."""
        try:
            async with asyncio.timeout(timeout):
                async with self._lock:
                    await self._send(msg, fds)
        except TimeoutError:
            raise SandboxError(f"the container's init took no command for {timeout:.0f} s") from None

    async def _send(self, msg: bytes, fds: list[int]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self.closed:
                raise OSError(errno.EBADF, "the control socket is closed")
            try:
                socket.send_fds(self.sock, [msg], fds)
                return
            except BlockingIOError:
                pass
            waiter = self._waiter = loop.create_future()
            loop.add_writer(self.sock, lambda: waiter.done() or waiter.set_result(None))
            try:
                await waiter
            finally:
                self._waiter = None
                if not self.closed:
                    loop.remove_writer(self.sock)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        waiter = self._waiter
        if waiter is not None:
            waiter.get_loop().remove_writer(self.sock)
            if not waiter.done():
                waiter.set_result(None)
        self.sock.close()


def _parse_reply(raw: bytes) -> tuple[int, str | None]:
    """PID 1's reply `{"code": int, "status": str|null}`; SandboxError on any other shape (the image, so its
    python3 that runs PID 1, is the caller's)."""
    try:
        answer = json.loads(raw)
    except ValueError:
        answer = None
    if isinstance(answer, dict):
        code, status = answer.get("code"), answer.get("status")
        if type(code) is int and (status is None or isinstance(status, str)):
            return code, status
    raise SandboxError(f"malformed reply from the container's init: {raw[:100]!r}")


def _parse_hello(raw: bytes) -> str:
    """PID 1's ready message `{"error": str}` ("" when ready); a malformed one is an error message."""
    if not raw:
        return "init closed the control socket"
    try:
        hello = json.loads(raw)
    except ValueError:
        hello = None
    if isinstance(hello, dict) and isinstance(hello.get("error"), str):
        return str(hello["error"])
    return f"malformed ready message {raw[:100]!r}"


async def _pump(loop: asyncio.AbstractEventLoop, sock: socket.socket, cap: OutputCap) -> None:
    """Read `sock` to EOF into `cap` (a reset counts as EOF: the container went away)."""
    try:
        while chunk := await loop.sock_recv(sock, 64 * 1024):
            cap.add(chunk)
    except OSError:
        pass


class DockerProcess(_inner.LauncherProcess):
    """A background command in a Docker sandbox; `kill()` kills its launcher's whole tree."""

    def __init__(self, box: DockerSandbox, token: str, task: asyncio.Future[tuple[int | None, str | None]]) -> None:
        super().__init__(token)
        self._box = box
        self._task = task

    async def _exit_code(self) -> int:
        ran = await asyncio.shield(self._task)
        code, _ = await self._box._exit_status(ran, self._token)
        return code if code is not None else _KILLED_BY_CLOSE

    async def _kill(self) -> None:
        await self._box._kill_run(self._token)
        await asyncio.shield(self._box._settle(self._task))
