"""How a local sandbox's commands start: one strategy per isolation mode, chosen once by the backend's probe.

- `Unisolated`: plain host processes in the sandbox's host directories (bubblewrap unusable here, or the
  operator's `isolation=none`); limits by `prlimit`; as root, the server spawns them as the sandbox's uid.
- `Bwrap`: a fresh `bwrap --unshare-all ...` per command, in a network namespace of its own; limits by
  `prlimit` inside; as root (no root launcher usable), the server spawns bwrap as the sandbox's uid.
- `BwrapNsenter` (root): `nsenter` switches to the sandbox's uid and joins the network namespace the server
  made for the sandbox, where bwrap stays (`--share-net`); limits by `prlimit` inside.
- `BwrapEnter` (root): the compiled helper (`enter`) does nsenter's work and sets the limits on bwrap itself,
  in one exec.

In a sandbox with users (`Box.userns`), bwrap joins the sandbox's user namespace (`--userns`, the descriptor
inherited) instead of making one, and runs the command as the inner user asked (`namespace_args`).

The root launchers let the server spawn without changing credentials (so Python can use vfork, not a full
fork of the server on the event loop), and let one namespace per sandbox replace one per command.
"""

from __future__ import annotations

import abc
import functools
import os
import secrets
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from coding_agent_env.sandbox.base import RelayEndpoint, SandboxPaths
from coding_agent_env.sandbox.local import enter
from coding_agent_env.sandbox.local.hostfs import HostMounts
from coding_agent_env.sandbox.local.layout import DEFAULT, ROOT_CAPS, Identity
from coding_agent_env.sandbox.local.netns import join_path
from coding_agent_env.sandbox.local.proc import HostCredentials

__all__ = [
    "AGENTS_MOUNT",
    "BWRAP_PATHS",
    "GUARD_MOUNT",
    "ROOT_SUBDIRS",
    "SHM_SUBDIR",
    "SUBDIRS",
    "TESTS",
    "Box",
    "Bwrap",
    "BwrapEnter",
    "BwrapNsenter",
    "Command",
    "Launch",
    "Unisolated",
    "bwrap_usage",
    "cgroup_join",
    "host_dirs",
    "namespace_args",
]

INNER_UID = 1000
SUBDIRS = {"workdir": "work", "home": "home", "tmp": "tmp", "logs": "logs"}
"""Each sandbox path's host directory under the sandbox root."""
SHM_SUBDIR = "shm"
"""The host directory under the sandbox root that bubblewrap shows at `/dev/shm`: inside the root's disk budget
(bwrap's own `/dev` is a tmpfs of its own, bounded by nothing but memory)."""
ROOT_SUBDIRS = (*SUBDIRS.values(), SHM_SUBDIR)
"""Every directory a sandbox root is made with."""
SHM_MOUNT = "/dev/shm"
BWRAP_PATHS = SandboxPaths(workdir="/workspace", home="/home/sandbox", tmp="/tmp", logs="/logs")
"""A bubblewrap sandbox's paths when its spec names no workdir and no hidden tests."""
TESTS = "/tests"
"""Shown (`SandboxSpec.tests`) as a symlink to `TESTS_TARGET`."""
TESTS_TARGET = f"{BWRAP_PATHS.logs}/tests"
"""What `/tests` links to: a directory only verify fills (see `RolloutRequest.verify_files_root`)."""
AGENTS_MOUNT = "/opt/agents"
GUARD_MOUNT = "/run/verify-site"
"""Where bubblewrap shows the path guard's directory, read-only (`Sandbox.path_guard`)."""
_RELAY_SOCKET = "/run/llm.sock"
_RELAY_FORWARDER = "/run/llm-forwarder.py"
_RELAY_LAUNCHER = f"""port="$1"; shift
python3 -I -S {_RELAY_FORWARDER} --detach {_RELAY_SOCKET} "$port" || {{ echo "LLM forwarder did not start" >&2; exit 111; }}
exec "$@"
"""
"""Starts the relay forwarder in the spawned command's own network namespace (`--detach` returns once it
listens: no readiness polling), then becomes the command. Only constants and positional arguments: nothing is
interpolated."""
_CGROUP_JOIN = 'while [ "$1" != -- ]; do echo 0 > "$1" || exit 126; shift; done; shift; exec "$@"'
"""Moves the shell into each group named before `--` (it writes `0`: itself), then becomes the rest: what the
command starts is in the groups from its first instruction. For strategies without the compiled helper."""


def cgroup_join(box: Box) -> list[str]:
    """The argv prefix that joins the sandbox's control groups first (nothing when it has none)."""
    if not box.cgroup_procs:
        return []
    return ["/bin/sh", "-c", _CGROUP_JOIN, "cae-cgroup", *box.cgroup_procs, "--"]


def host_dirs(root: Path) -> dict[str, Path]:
    """A sandbox root's host directories, by `SandboxPaths` field."""
    return {key: root / sub for key, sub in SUBDIRS.items()}


@dataclass(frozen=True)
class Box:
    """What a strategy needs of one sandbox: its host root and directories (`mounts`: sandbox paths to host
    paths), host uid (root only), limits, and the relay its agent reaches."""

    root: Path
    uid: int | None
    limits: Mapping[str, int]
    shell: str
    mounts: HostMounts
    relay: RelayEndpoint | None = None
    relay_port: int = 0
    agents_source: str | None = None
    cgroup_procs: tuple[str, ...] = ()
    """The files that move a process into the sandbox's control groups, which every command joins first (as
    root)."""
    paths: SandboxPaths = BWRAP_PATHS
    """Its paths as its commands see them (the workdir where its spec puts it, `/tests` only when shown)."""
    roots: tuple[tuple[str, Path], ...] = ()
    """Its further writable roots: (sandbox path, host directory), each bound there."""
    userns: int | None = None
    """Our descriptor of its user namespace (a sandbox with users: `layout`), which every command joins."""
    guard_source: Path | None = None
    """The host directory of the path guard (`sandbox.pathguard.install`), shown read-only where the mode can."""

    @property
    def hosts(self) -> dict[str, Path]:
        return host_dirs(self.root)

    def fresh_dir(self, prefix: str) -> Path:
        """A new, empty host directory under the root (mode 0700, owned by the sandbox's uid when it has one)."""
        path = self.root / f"{prefix}-{secrets.token_hex(6)}"
        path.mkdir(mode=0o700)
        if self.uid is not None:
            os.chown(path, self.uid, self.uid)
        return path


@dataclass(frozen=True)
class Command:
    """A command ready to start: host argv, host cwd (None: bwrap's `--chdir` sets it), and the credentials
    the server spawns it with, and the descriptors it inherits (at their numbers)."""

    argv: list[str]
    cwd: str | None
    creds: HostCredentials
    pass_fds: tuple[int, ...] = ()


def namespace_args(*, share_net: bool, userns: int | None = None, who: Identity = DEFAULT) -> list[str]:
    """bwrap's namespaces; with `share_net` the command stays in the network namespace it was started in
    (the sandbox's own, joined by a root launcher) instead of making one. With `userns` (a descriptor the
    command inherits at that number), it joins that user namespace rather than making one, as `who` (root with
    `ROOT_CAPS`, anyone else with none); `--block-fd` on the same descriptor makes bwrap close it before the
    command starts (reading a namespace file fails at once), so no command holds it."""
    if userns is None:
        args = ["--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
        args += ["--unshare-user", "--uid", str(INNER_UID), "--gid", str(INNER_UID)]
        if share_net:
            args.append("--share-net")
        return args
    args = ["--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try"]
    if not share_net:
        args.append("--unshare-net")
    args += ["--die-with-parent", "--new-session", "--userns", str(userns), "--block-fd", str(userns)]
    args += ["--uid", str(who.uid), "--gid", str(who.gid), "--cap-drop", "ALL"]
    if who.root:
        for cap in ROOT_CAPS:
            args += ["--cap-add", cap]
    return args


def _prlimit(limits: Mapping[str, int]) -> tuple[str, ...]:
    return ("prlimit", *(f"--{name}={value}" for name, value in limits.items()), "--")


class Launch(abc.ABC):
    """The isolation mode of every sandbox of one backend. `detail` says what the probe found."""

    isolation = "bwrap"
    """What results report."""
    own_netns = False
    """The server makes one network namespace per sandbox, which its commands join (root launchers)."""
    forwards_relay = True
    """Under network `llm`, a spawned command needs a way into its own network namespace to the relay (the
    server serving it there, or a forwarder it brings)."""
    reports_start = False
    """Whether `command(status_fd=...)` reports if the command started (bubblewrap's `--json-status-fd`: the
    probe sets it where bwrap has it)."""

    def __init__(self, detail: str) -> None:
        self.detail = detail

    def nproc_counts(self, own_uid: bool) -> bool:
        """Whether RLIMIT_NPROC counts only the sandbox's processes (its own user namespace, or, with `own_uid`,
        its own host uid): only then is the process limit set."""
        return True

    supports_users = False
    """Whether commands can run as other users (`SandboxSpec.users`): root launchers and root's plain bwrap."""

    def users_refusal(self) -> str | None:
        """Why this mode's commands cannot run as other users (None: they can); blocking."""
        return "unisolated commands run as one host user"

    def paths(self, hosts: Mapping[str, Path], *, workdir: str | None = None, tests: bool = False) -> SandboxPaths:
        """The sandbox's paths as its commands see them, given its host directories (see `host_dirs`), its
        spec's workdir (None: the sandbox's own) and whether it shows `/tests`."""
        return SandboxPaths(workdir=workdir or BWRAP_PATHS.workdir, home=BWRAP_PATHS.home, tmp=BWRAP_PATHS.tmp,
                            logs=BWRAP_PATHS.logs, tests=TESTS if tests else None)

    def agents_dir(self, source: str) -> str:
        return AGENTS_MOUNT

    def path_guard(self, source: Path, uid: int | None) -> str | None:
        """Where a sandbox's commands see the path guard's host directory `source` (a sandbox of host uid `uid`,
        None: the server's own), or None where its commands could write it (or it cannot be PYTHONPATH's one entry)."""
        return GUARD_MOUNT

    def network(self, relay: RelayEndpoint | None) -> str:
        return "none" if relay is None else "llm"

    def relay_url(self, relay: RelayEndpoint, port: int) -> str:
        return f"http://127.0.0.1:{port}/v1"

    def fresh_home(self, box: Box) -> Path | None:
        """A fresh host directory for a `fresh` command's HOME and TMPDIR, or None where the command gets
        private tmpfs ones from bwrap."""
        return None

    def fresh_shm(self, box: Box) -> Path | None:
        """A fresh host directory under the sandbox root for a `fresh` command's `/dev/shm` (inside the disk
        budget, empty: nothing an earlier command left), or None where commands see the host's."""
        return None

    @abc.abstractmethod
    def command(
        self, box: Box, argv: Sequence[str], cwd: str, *, fresh: bool, netns: int | None, forwarder: bool = False,
        shm: Path | None = None, who: Identity = DEFAULT, status_fd: int | None = None,
    ) -> Command:
        """How to start argv in `box` (`cwd` a sandbox path) in network namespace `netns` (None: a new one);
        with `forwarder`, the relay forwarder runs beside it in that new namespace. `shm`: the host directory
        shown at `/dev/shm` (default: the sandbox's own, `SHM_SUBDIR`), where there is a private `/dev`. `who`:
        the inner user, in a sandbox with users (`box.userns`). `status_fd` (bubblewrap only, `reports_start`):
        a descriptor the command inherits, on which bwrap reports whether the command started (`started`)."""

    def kills_by_uid(self, box: Box) -> bool:
        """Whether close() must end every process of the sandbox's uid (they may have left their group)."""
        return False


class Unisolated(Launch):
    isolation = "none"
    forwards_relay = False  # the host's network: the relay's own loopback URL is reachable as it is

    def nproc_counts(self, own_uid: bool) -> bool:
        return own_uid

    def paths(self, hosts: Mapping[str, Path], *, workdir: str | None = None, tests: bool = False) -> SandboxPaths:
        assert workdir is None  # refused at create (`layout.LocalLayout.of`)
        return SandboxPaths(**{key: str(path) for key, path in hosts.items()})

    def agents_dir(self, source: str) -> str:
        return source

    def path_guard(self, source: Path, uid: int | None) -> str | None:
        # The host directory itself: read-only to a sandbox uid of its own (the server's user owns it); commands
        # running as the server's own user could rewrite it, so none then (verify keeps the safe path alone), nor
        # where it cannot be PYTHONPATH's one entry (a `:` in STATE_DIR).
        own = uid is None or uid == os.geteuid()
        return None if own or ":" in str(source) else str(source)

    def network(self, relay: RelayEndpoint | None) -> str:
        return "host"  # no network namespace: whatever the policy asked, the host's network is there

    def relay_url(self, relay: RelayEndpoint, port: int) -> str:
        return relay.tcp_url

    def fresh_home(self, box: Box) -> Path | None:
        return box.fresh_dir("fresh")

    def command(
        self, box: Box, argv: Sequence[str], cwd: str, *, fresh: bool, netns: int | None, forwarder: bool = False,
        shm: Path | None = None, who: Identity = DEFAULT, status_fd: int | None = None,
    ) -> Command:
        assert box.userns is None  # refused at create
        head = [*cgroup_join(box), *_prlimit(box.limits)]
        return Command([*head, *argv], str(box.mounts.host_path(cwd)), HostCredentials(box.uid, box.uid))

    def kills_by_uid(self, box: Box) -> bool:
        return box.uid is not None


_UNASKED = object()
_USAGE_TIMEOUT_S = 10.0
"""How long `bwrap --help` may take."""


@functools.cache
def bwrap_usage(bwrap: str) -> str:
    """What `bwrap --help` prints (its options: what this bubblewrap can do), asked once per binary; empty when it
    cannot run. Blocking: call it off the event loop."""
    try:
        done = subprocess.run([bwrap, "--help"], capture_output=True, timeout=_USAGE_TIMEOUT_S, env={}, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.decode(errors="replace") + done.stderr.decode(errors="replace")


class Bwrap(Launch):
    """bubblewrap started by the server itself (as the sandbox's uid when root)."""

    supports_users = True  # as root: the backend checks

    def users_refusal(self) -> str | None:
        """Why this bwrap cannot join a sandbox's user namespace (`--userns`, `--block-fd`: bubblewrap 0.7 and
        later), or None; asked once (`bwrap_usage`), off the event loop."""
        if self._users_refusal is _UNASKED:
            usage = bwrap_usage(self.bwrap)
            missing = [flag for flag in ("--userns ", "--block-fd ") if flag not in usage]
            self._users_refusal = (
                f"bubblewrap at {self.bwrap} has no {' or '.join(f.strip() for f in missing)} (0.7 or later needed)"
                if missing else None
            )
        return self._users_refusal  # type: ignore[return-value]

    def __init__(self, detail: str, bwrap: str, system_args: Sequence[str]) -> None:
        super().__init__(detail)
        self.bwrap = bwrap
        self.system_args = tuple(system_args)
        self._users_refusal: object = _UNASKED

    def fresh_shm(self, box: Box) -> Path | None:
        return box.fresh_dir(SHM_SUBDIR)

    def command(
        self, box: Box, argv: Sequence[str], cwd: str, *, fresh: bool, netns: int | None, forwarder: bool = False,
        shm: Path | None = None, who: Identity = DEFAULT, status_fd: int | None = None,
    ) -> Command:
        inner = self._bwrap(box, argv, cwd, fresh=fresh, netns=netns, forwarder=forwarder, shm=shm, who=who)
        passed = (box.userns,) if box.userns is not None else ()
        if status_fd is not None:
            inner[1:1] = ["--json-status-fd", str(status_fd)]
            passed += (status_fd,)
        return Command([*self._root_launcher(box, netns), *inner], None, self._creds(box), passed)

    def _bwrap(
        self, box: Box, argv: Sequence[str], cwd: str, *, fresh: bool, netns: int | None, forwarder: bool,
        shm: Path | None = None, who: Identity = DEFAULT,
    ) -> list[str]:
        paths, hosts = box.paths, box.hosts
        # Over the `/dev` the system arguments made (they come first): `/dev/shm` in the disk budget.
        binds: list[str] = ["--bind", str(shm or box.root / SHM_SUBDIR), SHM_MOUNT]
        binds += ["--bind", str(hosts["workdir"]), paths.workdir]
        for path, host in box.roots:
            binds += ["--bind", str(host), path]
        if box.agents_source is not None:
            binds += ["--ro-bind", box.agents_source, AGENTS_MOUNT]
        if box.guard_source is not None:
            binds += ["--ro-bind", str(box.guard_source), GUARD_MOUNT]
        if forwarder:
            assert box.relay is not None and netns is None
            binds += ["--bind", box.relay.socket_path, _RELAY_SOCKET]
            binds += ["--ro-bind", box.relay.forwarder_path, _RELAY_FORWARDER]
            argv = [box.shell, "-c", _RELAY_LAUNCHER, "relay-launcher", str(box.relay_port), *argv]
        binds += ["--bind", str(hosts["logs"]), paths.logs]
        if paths.tests is not None:
            binds += ["--symlink", TESTS_TARGET, paths.tests]
        if fresh:
            binds += ["--tmpfs", paths.home, "--tmpfs", paths.tmp]
        else:
            binds += ["--bind", str(hosts["home"]), paths.home, "--bind", str(hosts["tmp"]), paths.tmp]
        spaces = namespace_args(share_net=netns is not None, userns=box.userns, who=who)
        head = [self.bwrap, *spaces, *self.system_args, *binds, "--chdir", cwd]
        return [*head, "--", *self._prlimit(box), *argv]

    def _root_launcher(self, box: Box, netns: int | None) -> list[str]:
        """What starts bwrap as the sandbox's uid (in `netns`), after joining its control groups; here the
        server's spawn switches the uid."""
        return cgroup_join(box)

    def _prlimit(self, box: Box) -> tuple[str, ...]:
        return _prlimit(box.limits)

    def _creds(self, box: Box) -> HostCredentials:
        return HostCredentials(box.uid, box.uid)


class _RootLaunched(Bwrap):
    """bubblewrap started by a root launcher, `program`, which switches to the sandbox's uid and joins its
    network namespace: the server spawns with its own credentials."""

    own_netns = True

    def __init__(self, detail: str, bwrap: str, system_args: Sequence[str], program: str) -> None:
        super().__init__(detail, bwrap, system_args)
        self.program = program

    def _creds(self, box: Box) -> HostCredentials:
        return HostCredentials()


class BwrapNsenter(_RootLaunched):
    def _root_launcher(self, box: Box, netns: int | None) -> list[str]:
        assert box.uid is not None
        joined = [f"--net={join_path(netns)}"] if netns is not None else []
        return [*cgroup_join(box), self.program, *joined, "-S", str(box.uid), "-G", str(box.uid), "--"]


class BwrapEnter(_RootLaunched):
    def _root_launcher(self, box: Box, netns: int | None) -> list[str]:
        assert box.uid is not None
        netns_path = join_path(netns) if netns is not None else None
        return enter.argv(self.program, netns_path, box.uid, box.limits, box.cgroup_procs)

    def _prlimit(self, box: Box) -> tuple[str, ...]:
        return ()  # set on bwrap itself by the helper, inherited by everything inside
