"""The async sandbox contract every backend implements.

A `Sandbox` is one rollout's isolated place to run commands. Paths given to it are *sandbox paths*: a
relative path is relative to `paths.workdir`; an absolute path must lie under one of the sandbox's writable
roots (`paths.workdir`, `paths.home`, `paths.tmp`, `paths.logs`). File operations never follow a symlink out
of those roots.

Environments are never inherited from the server: a command sees `base_env()` (the standard variables, then the
sandbox's `task_env`: its image's ENV and the request's `env`) plus what the caller passes.

Lifecycle: created open by its backend's `create()`; `close()` kills every process it started and removes
everything it made; `close()` is idempotent and safe after cancellation. Any use after close raises
`SandboxClosedError`.
"""

from __future__ import annotations

import abc
import asyncio
import enum
import math
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from coding_agent_env.errors import SandboxClosedError, SandboxFileError, SandboxUnsupportedError
from coding_agent_env.models import SANDBOX_OWN_ENV
from coding_agent_env.settings import Settings, SettingsSection

__all__ = [
    "Attached",
    "BackendStatus",
    "ExecResult",
    "FileEntry",
    "MAX_READ_BYTES",
    "Process",
    "RelayEndpoint",
    "SANDBOX_OWN_ENV",
    "STANDARD_PATH",
    "Sandbox",
    "SandboxBackend",
    "SandboxLimits",
    "SandboxPaths",
    "SandboxSpec",
    "SandboxState",
    "SandboxTemplate",
    "image_env",
    "over_read_cap",
    "read_cap",
    "rlimits",
    "scopes",
]


@dataclass(frozen=True)
class RelayEndpoint:
    """Where the server's LLM relay listens, as the host sees it."""

    socket_path: str
    """Unix socket of the relay (bind-mounted into sandboxes that have no network)."""
    tcp_url: str
    """Loopback base URL of the relay, e.g. `http://127.0.0.1:PORT/v1` (for unisolated sandboxes)."""
    forwarder_path: str
    """A stdlib-only Python file, `forwarder.py SOCKET PORT`, that maps a loopback TCP port inside a
    network-less sandbox onto the bind-mounted socket."""
    public_url: str | None = None
    """The relay as a remote sandbox reaches it over the network (the server's public relay route, or the
    relay's own listener for an engine on this host); the per-rollout token is what guards it."""
    serve: Callable[[socket.socket], Awaitable[Callable[[], Awaitable[None]]]] | None = None
    """Optional: serve the relay on a bound TCP socket the backend made (in a sandbox's network namespace, say),
    listening on it and taking ownership of it; returns the coroutine function that stops serving and closes
    it (idempotent).
    A backend that can make such a socket uses this instead of the forwarder: no process to start, no hop."""


@dataclass(frozen=True)
class SandboxLimits(SettingsSection):
    """What one sandbox may use. Sandbox-wide: `memory_mb` (all its processes together), `disk_mb` (what it
    writes), `max_processes`, `cpus` (a share of CPU time; 0: not bounded). Per process (rlimits): `memory_mb`
    as the data segment, `max_file_mb`, `cpu_s`. A backend enforces what it can and says which in
    `Sandbox.limits` and `Sandbox.limit_scopes`."""

    PREFIX = "sandbox_"

    memory_mb: int
    disk_mb: int
    max_processes: int
    cpus: float
    max_file_mb: int
    cpu_s: int

    def rlimits(self, *, nproc: bool) -> dict[str, int]:
        """The per-process limits set on every sandboxed command, by `prlimit` name (`data`, `fsize`, `cpu`, and
        with `nproc` the process limit: only where it really counts the sandbox's own processes)."""
        limits = {"data": self.memory_mb << 20, "fsize": self.max_file_mb << 20, "cpu": self.cpu_s}
        if nproc:
            limits["nproc"] = self.max_processes
        return limits


_SCOPES = {"data": "process", "fsize": "process", "cpu": "process", "nproc": "sandbox", "memory": "sandbox",
           "pids": "sandbox", "nano_cpus": "sandbox", "disk": "sandbox"}


def scopes(limits: Mapping[str, int], **overrides: str) -> dict[str, str]:
    """Each limit's scope: `process` (an rlimit of every process), `sandbox` (all of the sandbox together; an
    rlimit on processes counts the sandbox's own only where it is set at all), or what `overrides` say (e.g.
    Docker's `disk` bounds the `workdir` only)."""
    return {name: overrides.get(name, _SCOPES.get(name, "sandbox")) for name in limits}


@dataclass(frozen=True)
class SandboxSpec:
    """What a rollout asks of its sandbox. Backends ignore what they cannot use and report it.

    `network`: `none` (no network at all), `llm` (only the relay in `relay` is reachable, at
    `Sandbox.relay_url`, from processes started by `spawn`; on a remote backend the operator may let it mean the
    relay's public URL over the pod's own network), `host` (the host's network; operator opt-in)."""

    rollout_id: str
    image: str | None = None
    network: Literal["none", "llm", "host"] = "none"
    relay: RelayEndpoint | None = None
    agents_dir: str | None = None
    """Host directory of pre-installed agents to make visible read-only (at `Sandbox.agents_dir`)."""
    limits: SandboxLimits | None = None
    """What the sandbox may use; None: the server's settings."""
    env: Mapping[str, str] = field(default_factory=dict)
    """The task's variables for every command (`RolloutRequest.env`), over the image's own (`Sandbox.task_env`)."""
    workdir: str | None = None
    """Where the workspace is shown and commands start (`Task.workdir`, absolute); None: the backend's own
    (`/workspace`). A backend that cannot show it there refuses (`SandboxUnsupportedError` naming `workdir`),
    never running the task elsewhere; `Sandbox.paths.workdir` is then this path."""
    writable_roots: tuple[str, ...] = ()
    """Further directories, by absolute path, made empty and writable for the task besides the standard layout
    (`/solution` for the oracle, the top directories of `Task.outside_files`); a backend that cannot refuses."""
    tests: bool = False
    """Whether `/tests` is shown (Harbor's hidden tests: `paths.tests`); a sandbox without it has none there."""
    users: bool = False
    """Whether commands may run as other users (`exec(user=...)`): root of the sandbox's own user namespace, with
    namespace-only capabilities and enough mapped ids to switch to another user (`nobody`); never the host's
    root. A backend that cannot refuses (`SandboxUnsupportedError` naming the users)."""
    deadline_s: float | None = None
    """The rollout's whole deadline. A backend whose sandboxes end by themselves (a remote VM or Job) gives
    them at least this lifetime plus `REMOTE_LIFETIME_MARGIN_S`, so one never ends under a running rollout
    and one left by a crashed server ends soon after; None means the backend's configured lifetime."""

    def lifetime_s(self, default_s: int) -> int:
        """Seconds a self-ending sandbox should live: see `deadline_s`."""
        if self.deadline_s is None:
            return default_s
        return math.ceil(self.deadline_s) + REMOTE_LIFETIME_MARGIN_S


REMOTE_LIFETIME_MARGIN_S = 120
"""Lifetime beyond the rollout's deadline for self-ending sandboxes: room for teardown and clock skew."""


@dataclass(frozen=True)
class SandboxPaths:
    """Directories as commands inside the sandbox see them."""

    workdir: str
    home: str
    tmp: str
    logs: str
    tests: str | None = None
    """`/tests` when the sandbox shows `{logs}/tests` there (Harbor's hidden tests, see
    `RolloutRequest.verify_files_root`); None when it cannot."""


@dataclass(frozen=True)
class ExecResult:
    """A finished command. Output beyond the cap was drained and dropped; `*_dropped` counts those bytes."""

    exit_code: int | None
    stdout: bytes
    stderr: bytes
    duration_s: float
    timed_out: bool = False
    stdout_dropped: int = 0
    stderr_dropped: int = 0


@dataclass(frozen=True)
class FileEntry:
    """One entry of a directory listing; `path` is relative to the listed directory."""

    path: str
    kind: Literal["file", "dir", "symlink", "other"]
    size: int


@dataclass(frozen=True)
class BackendStatus:
    """Whether a backend can run here, and with what isolation."""

    name: str
    available: bool
    isolation: str | None
    detail: str = ""
    limits: Mapping[str, int] = field(default_factory=dict)
    limit_scopes: Mapping[str, str] = field(default_factory=dict)
    """Each limit's scope (see `scopes`); derived from the names when the backend gives none."""

    def __post_init__(self) -> None:
        if self.limits and not self.limit_scopes:
            object.__setattr__(self, "limit_scopes", scopes(self.limits))


def rlimits(settings: Settings, *, nproc: bool) -> dict[str, int]:
    """`SandboxLimits.rlimits` of the settings' limits."""
    return SandboxLimits.from_settings(settings).rlimits(nproc=nproc)


class SandboxState(enum.Enum):
    OPEN = "open"
    CLOSED = "closed"


class Process(abc.ABC):
    """A background process started by `Sandbox.spawn`; its whole process tree is killed by `kill()`."""

    @property
    @abc.abstractmethod
    def returncode(self) -> int | None:
        """Exit code once it has exited (negative for a signal), else None."""

    @abc.abstractmethod
    async def wait(self) -> int:
        """Wait for the process to exit and return its exit code. Cancel the caller to stop waiting."""

    @abc.abstractmethod
    async def kill(self) -> None:
        """Kill the whole process tree and reap it. Idempotent; safe when it already exited."""


@dataclass
class Attached:
    """A process started by `Sandbox.attach`, with a pipe to its stdin and one from its stdout and stderr
    (merged). Whatever it writes is the sandbox's (untrusted): read it bounded. `close()` kills the whole tree
    and closes both pipes; idempotent."""

    process: Process
    reader: asyncio.StreamReader
    reading: asyncio.BaseTransport
    """The transport `reader` is fed by (closed by `close()`)."""
    writer: asyncio.WriteTransport

    async def write(self, data: bytes) -> None:
        """Queue `data` for the process's stdin (a pipe: the transport buffers it; a dead reader is ignored)."""
        if not self.writer.is_closing():
            self.writer.write(data)

    async def close(self) -> None:
        try:
            await self.process.kill()
        finally:
            self.writer.close()
            self.reading.close()


STANDARD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def image_env(entries: Sequence[str] | None) -> dict[str, str]:
    """An image's `Config.Env` (`NAME=value` strings) as a mapping."""
    env: dict[str, str] = {}
    for entry in entries or ():
        name, sep, value = entry.partition("=")
        if sep and name:
            env[name] = value
    return env


MAX_READ_BYTES = 64 << 20
"""The most `Sandbox.read_bytes` returns when no `max_bytes` is given: a sandbox can make a file of any size,
and the server's memory is not its to fill."""


def over_read_cap(path: str, data: bytes, max_bytes: int | None) -> bytes:
    """`data` read with `read_cap(max_bytes)`; `SandboxFileError` when an uncapped read found more than
    `MAX_READ_BYTES` (see `Sandbox.read_bytes`)."""
    if max_bytes is None and len(data) > MAX_READ_BYTES:
        raise SandboxFileError(f"{path!r} is larger than the read cap of {MAX_READ_BYTES} bytes")
    return data


def read_cap(max_bytes: int | None) -> int:
    """How many bytes a backend reads for `max_bytes`: itself, or one past `MAX_READ_BYTES` (to tell a file
    over the cap, see `over_read_cap`)."""
    return MAX_READ_BYTES + 1 if max_bytes is None else max_bytes


class Sandbox(abc.ABC):
    """One rollout's sandbox. See the module docstring for the path, env and lifecycle contract."""

    backend: str
    """Registry name of the backend that made it."""

    id: str
    """Backend-specific identifier (a directory name, a container id, ...)."""

    isolation: str
    """Isolation really in effect: `bwrap`, `docker`, `none`, ..."""

    paths: SandboxPaths
    relay_url: str | None = None
    """Base URL at which processes started by `spawn` reach the LLM relay (network `llm`), else None."""
    agents_dir: str | None = None
    """Where the spec's `agents_dir` is visible inside (read-only), else None."""
    path_guard: str | None = None
    """Where the path guard (`sandbox.pathguard`) is visible inside: a directory no process of the sandbox can
    write (a read-only mount, or owned by a user none of its processes runs as), which hardened verify names in
    PYTHONPATH. None where the backend cannot promise that: verify then runs with Python's safe path alone."""
    shell: str = "/bin/bash"
    """Shell used to run the task's command strings (`shell -c CMD`)."""
    network: str = "none"
    """Network really in effect: `none`, `llm` (only the relay), `llm-public` (the pod's own outbound network,
    the agent configured with the relay's public URL and token), or `host` (whatever the host or pod reaches,
    e.g. an unisolated fallback or a pod with outbound network)."""
    limits: Mapping[str, int] = MappingProxyType({})
    """Limits really enforced, by name: `data`, `fsize`, `cpu`, `nproc` (rlimits); `memory`, `disk` (bytes),
    `pids`, `nano_cpus` (1e9 = one CPU) for the sandbox as a whole; empty where the backend enforces none."""
    limit_scopes: Mapping[str, str] = MappingProxyType({})
    """Each of `limits`' scope (see `scopes`)."""

    task_env: Mapping[str, str] = MappingProxyType({})
    """Variables the task sets for every command: the image's ENV where the backend runs an image, then the
    spec's `env`. Set by the backend at create; `SANDBOX_OWN_ENV` names are never taken from it."""

    def __init__(self) -> None:
        self._state = SandboxState.OPEN

    @property
    def closed(self) -> bool:
        return self._state is SandboxState.CLOSED

    def _check_open(self) -> None:
        if self._state is SandboxState.CLOSED:
            raise SandboxClosedError(f"sandbox {self.id} is closed")

    def base_env(self) -> dict[str, str]:
        """The environment every command starts from (nothing of the server's own): the standard variables, then
        `task_env` (whose PATH, say, replaces ours; the sandbox's own HOME, TMPDIR, USER and LOGNAME stay)."""
        env = {
            "PATH": STANDARD_PATH,
            "HOME": self.paths.home,
            "TMPDIR": self.paths.tmp,
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "USER": "sandbox",
            "LOGNAME": "sandbox",
            "PYTHONNOUSERSITE": "1",
        }
        for name, value in self.task_env.items():
            if name not in SANDBOX_OWN_ENV:
                env[name] = value
        return env

    @abc.abstractmethod
    async def exec(
        self,
        argv: Sequence[str],
        *,
        timeout: float,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        fresh: bool = False,
        max_output_bytes: int,
        user: str | None = None,
    ) -> ExecResult:
        """Run argv to completion (no shell is added). At `timeout` seconds the whole tree is killed and
        `timed_out` is set. `env` is added to `base_env()`; `cwd` defaults to the workdir. With `fresh`, the
        command gets an empty private HOME and /tmp that no earlier command could have written. `user` (a name
        or uid, resolved inside the sandbox): who it runs as, in a sandbox made with `SandboxSpec.users`
        (otherwise `SandboxUnsupportedError`); None: the sandbox's own unprivileged user."""

    @abc.abstractmethod
    async def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        log_path: str | None = None,
        user: str | None = None,
    ) -> Process:
        """Start argv in the background, its stdout and stderr appended to `log_path` (a sandbox path) or
        discarded. The caller owns the returned process and must `kill()` it; `close()` kills it too."""

    async def attach(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
    ) -> Attached:
        """Start argv in the background with pipes to its stdin and from its stdout and stderr (a live shell,
        `sandbox.shell.live`). The caller owns it and must `close()` it; the sandbox's `close()` kills it too.
        `SandboxUnsupportedError` where the backend cannot hold such a process (the caller falls back)."""
        raise SandboxUnsupportedError(self.backend, "live shell", "this backend cannot attach to a process")

    @abc.abstractmethod
    async def read_bytes(self, path: str, *, max_bytes: int | None = None, tail: bool = False) -> bytes:
        """Read a regular file the sandbox may have made (untrusted: see DESIGN "Everything a sandbox produces
        is untrusted"). `SandboxFileNotFoundError` if missing; `SandboxFileNotRegularError` if it is anything
        but a regular file (a FIFO, socket, device or directory, or a symlink: never followed); never blocks
        the event loop, whatever is at `path`. With `max_bytes`, at most that many bytes: the first ones, or the
        last ones with `tail`. Without, at most `MAX_READ_BYTES`: a larger file raises `SandboxFileError`
        (ask for a slice instead)."""

    @abc.abstractmethod
    async def write_bytes(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        """Write a file, creating parent directories; a symlink at `path` is replaced, never followed."""

    @abc.abstractmethod
    async def mkdir(self, path: str) -> None:
        """Create a directory and its parents, owned by the sandbox user; existing is fine."""

    @abc.abstractmethod
    async def remove(self, path: str) -> None:
        """Remove a file, symlink or directory tree, never following symlinks; missing is fine."""

    @abc.abstractmethod
    async def list_files(self, path: str, *, max_entries: int) -> tuple[list[FileEntry], bool]:
        """List a directory tree without following symlinks, sorted, at most `max_entries` entries.
        Returns the entries and whether the listing was cut short."""

    async def limits_hit(self) -> list[str]:
        """Which of the sandbox-wide limits were hit so far, in words (OOM kills, refused forks, a full disk);
        empty when none or when the backend cannot tell."""
        return []

    @abc.abstractmethod
    async def _close(self) -> None:
        """Backend teardown; called at most once."""

    async def read_text(self, path: str, *, max_bytes: int | None = None, tail: bool = False) -> str:
        return (await self.read_bytes(path, max_bytes=max_bytes, tail=tail)).decode("utf-8", "replace")

    async def write_text(self, path: str, text: str, *, mode: int = 0o644) -> None:
        await self.write_bytes(path, text.encode("utf-8", "surrogateescape"), mode=mode)

    async def close(self) -> None:
        """Kill everything and remove everything. Idempotent."""
        if self._state is SandboxState.CLOSED:
            return
        self._state = SandboxState.CLOSED
        await self._close()

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class SandboxTemplate(abc.ABC):
    """A set-up sandbox's files and directories, frozen (`SandboxBackend.snapshot`): what the members of a group
    start from (`SandboxBackend.fork`). Its processes are gone: processes do not fork, files do. It holds what it
    froze (a directory tree, an image) until `release`, which its owner calls once no member is being forked from
    it; members already forked keep what they need of it until they close. `release` is idempotent and survives
    cancellation."""

    backend: str
    id: str
    """Names it in logs, reports and the reaper's labels."""
    method: str
    """How it was frozen (`GroupReport.method`): `overlay` (local), `layers` or `image` (Docker)."""
    size: int = 0
    """Bytes its writable layer holds (what setup wrote: a local tmpfs's used blocks, a Docker container's
    layer), measured once frozen; 0 when not known. The group registry's bytes budget counts it."""
    _released: bool = False

    @property
    def released(self) -> bool:
        """Whether `release` was called: no member may be forked from it any more."""
        return self._released

    async def release(self) -> None:
        """Give back what the template holds (once; later calls return at once)."""
        if self._released:
            return
        self._released = True
        await self._release()

    @abc.abstractmethod
    async def _release(self) -> None: ...


class SandboxBackend(abc.ABC):
    """Makes sandboxes of one kind; built from its configuration and the settings, lazily, by `Backends`.

    Forking (groups of rollouts that share a setup): a backend that can freeze a set-up sandbox's files and start
    others from them copy-on-write overrides `fork_refusal`, `snapshot` and `fork`; the defaults say it cannot,
    and callers then run the setup in every member."""

    name: str

    @abc.abstractmethod
    def check(self) -> BackendStatus:
        """Report whether this backend can run here (engine, binary, credentials) without side effects."""

    @abc.abstractmethod
    async def create(self, spec: SandboxSpec) -> Sandbox:
        """Provision a sandbox; raises `SandboxError` (or a subclass) when it cannot."""

    async def refusal(self) -> str | None:
        """Why this backend will make no sandbox here (said before anything runs), or None. Cheap after its
        first call; the default: none known until `create` says otherwise."""
        return None

    def network_refusal(self, network: str) -> str | None:
        """Why this backend makes no sandbox with network policy `network` as configured, or None. Default: none
        known until `create` says otherwise."""
        return None

    def fork_refusal(self, spec: SandboxSpec) -> str | None:
        """Why sandboxes of `spec` cannot be forked from a template here (setup then runs in every member), or
        None when `snapshot` and `fork` work for them. Default: this backend cannot fork."""
        return f"the {self.name} backend cannot fork a set-up sandbox"

    async def snapshot(self, sandbox: Sandbox) -> SandboxTemplate:
        """Freeze `sandbox` (made by this backend from a spec `fork_refusal` accepts) into a template: its
        processes are killed and it is closed; its files and directories are kept as they are. On failure the
        sandbox is closed all the same. Default: `SandboxUnsupportedError`."""
        await sandbox.close()
        raise SandboxUnsupportedError(self.name, "group", f"the {self.name} backend cannot fork a set-up sandbox")

    async def fork(self, spec: SandboxSpec, template: SandboxTemplate) -> Sandbox:
        """A new sandbox of `spec` (the spec the template was made from, but for its rollout id, network and
        relay), whose files start as the template's, copy-on-write: its writes are its own, as are its
        processes, network and limits, exactly as a sandbox from `create`. Default: `SandboxUnsupportedError`."""
        raise SandboxUnsupportedError(self.name, "group", self.fork_refusal(spec) or "")

    async def reap_orphans(self) -> int:
        """Remove sandboxes left behind by a crashed server; returns how many. Default: none to reap."""
        return 0

    async def aclose(self) -> None:
        """Release what the backend holds (an SDK client); its sandboxes are their creators' to close.
        Default: nothing to release."""
