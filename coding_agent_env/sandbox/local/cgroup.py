"""One control group per local sandbox (as root): its memory, processes and CPU bounded as a whole, and a tidy
kill of everything it started.

`Cgroups.discover()` finds, once, where this server may make groups: below its own group in cgroup v2 when the
`memory`, `pids` and `cpu` controllers are enabled there, else in the cgroup v1 hierarchies of those three
controllers (a host may mount either; these machines mount v1 controllers and an empty v2 `unified`). A
sandbox's group is made below the server's own (so a host or container limit on the server still covers it),
named `cae-<sandbox id>`, where the id begins with the server's pid: groups of a server that died are found
and removed by `reap`.

Contracts of `SandboxCgroup`:
- `procs` are the files a process writes `0` to, to move itself in (before it execs the sandbox's command,
  so everything the command starts is inside from its first instruction);
- `kill()` stops new processes (`pids.max` 0, or v2's `cgroup.kill`), then SIGKILLs what is left through
  pidfds, each checked to be in the group after it was opened (a pid read from `cgroup.procs` may be reused),
  until the group is empty or the deadline passes; `remove()` then removes it;
- `hits()` says which limits were hit, from the kernel's own counters (OOM kills, refused forks).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from coding_agent_env.pids import pid_alive
from coding_agent_env.sandbox.cgroups import limit_hits

__all__ = ["CgroupLimits", "Cgroups", "SandboxCgroup"]

log = logging.getLogger(__name__)

_ROOT = Path("/sys/fs/cgroup")
_CONTROLLERS = ("memory", "pids", "cpu")
_CPU_PERIOD_US = 100_000
_PREFIX = "cae-"
_V1_SHARES_PER_WEIGHT = 1024 / 100
"""cgroup v1's `cpu.shares` (a process: 1024) per unit of v2's `cpu.weight` (a process: 100)."""
_V1_MIN_SHARES = 2


@dataclass(frozen=True)
class CgroupLimits:
    """What a sandbox's group bounds: bytes of memory (its processes' and its tmpfs pages), processes and
    threads, CPUs (a share of the period; 0: not bounded), and its CPU weight beside the server's processes
    (cgroup v2's `cpu.weight` scale, where a process has 100; v1's `cpu.shares` scaled from it): who runs first
    under contention, not a bound (`LocalConfig.cpu_weight`)."""

    memory_bytes: int
    max_processes: int
    cpus: float
    cpu_weight: int = 100


@dataclass(frozen=True)
class Cgroups:
    """Where sandbox groups are made: one directory (v2) or one per controller (v1)."""

    version: int
    parents: dict[str, Path]
    """Controller -> the server's own group in that hierarchy (v2: the same directory for all three)."""

    @classmethod
    def discover(cls) -> Cgroups | None:
        """The groups this process may make sandbox groups in, or None (not root, no controllers, read-only)."""
        if os.geteuid() != 0:
            return None
        own = _own_groups()
        found = _v2(own.get("")) or _v1(own)
        if found is None:
            return None
        probe = found.make(f"probe-{os.getpid()}-{time.monotonic_ns()}", CgroupLimits(64 << 20, 8, 0.5))
        if probe is None:
            return None
        probe.remove()
        return found

    @property
    def detail(self) -> str:
        return f"cgroup v{self.version} ({', '.join(_CONTROLLERS)})"

    def make(self, name: str, limits: CgroupLimits) -> SandboxCgroup | None:
        """A new group `cae-<name>` with `limits`, or None (logged) when the kernel refuses."""
        paths = {controller: parent / f"{_PREFIX}{name}" for controller, parent in self.parents.items()}
        made: list[Path] = []
        try:
            for path in dict.fromkeys(paths.values()):
                path.mkdir(mode=0o755)
                made.append(path)
            group = SandboxCgroup(self.version, paths)
            group.set_limits(limits)
        except OSError as exc:
            log.warning("cannot make a sandbox cgroup: %s", exc)
            for path in made:
                with contextlib.suppress(OSError):
                    path.rmdir()
            return None
        return group

    def reap(self) -> int:
        """Kill and remove the groups of servers that are gone; how many."""
        reaped = 0
        for parent in dict.fromkeys(self.parents.values()):
            try:
                children = list(parent.iterdir())
            except OSError:
                continue
            for child in children:
                owner = child.name.removeprefix(_PREFIX).split("-", 1)[0]
                if not child.name.startswith(_PREFIX) or not owner.isdigit() or pid_alive(int(owner)):
                    continue
                group = SandboxCgroup(self.version, {"all": child})
                group.kill(deadline_s=2.0)
                if group.remove():
                    reaped += 1
        return reaped


class SandboxCgroup:
    """One sandbox's group; see the module docstring."""

    def __init__(self, version: int, paths: dict[str, Path]) -> None:
        self.version = version
        self.paths = paths
        self._dirs = tuple(dict.fromkeys(paths.values()))

    @property
    def procs(self) -> tuple[str, ...]:
        """The files a single-threaded process writes `0` to, to move itself in. In v1 the thread's own `tasks`
        file: moving just the current thread skips the global threadgroup lock (and the RCU grace period its
        writer waits for, a few milliseconds on an idle machine); for a process of one thread, the same move."""
        return tuple(str(path / self._join_file) for path in self._dirs)

    @property
    def _join_file(self) -> str:
        return "tasks" if self.version == 1 else "cgroup.procs"

    def give_to(self, uid: int) -> None:
        """Let processes of `uid` move themselves in (only in: every other group stays root's to write)."""
        for path in self._dirs:
            os.chown(path / self._join_file, uid, -1)

    def set_limits(self, limits: CgroupLimits) -> None:
        quota = f"{round(limits.cpus * _CPU_PERIOD_US)}" if limits.cpus > 0 else None
        if self.version == 2:
            path = self._dirs[0]
            _write(path / "memory.max", limits.memory_bytes)
            _write_optional(path / "memory.swap.max", 0)
            _write(path / "pids.max", limits.max_processes)
            _write(path / "cpu.weight", limits.cpu_weight)
            if quota is not None:
                _write(path / "cpu.max", f"{quota} {_CPU_PERIOD_US}")
            return
        memory, pids, cpu = (self.paths[c] for c in _CONTROLLERS)
        _write(memory / "memory.limit_in_bytes", limits.memory_bytes)
        # Where swap is accounted, memory + swap gets the same bound: no escaping the limit into swap.
        _write_optional(memory / "memory.memsw.limit_in_bytes", limits.memory_bytes)
        _write(pids / "pids.max", limits.max_processes)
        _write(cpu / "cpu.shares", max(_V1_MIN_SHARES, round(limits.cpu_weight * _V1_SHARES_PER_WEIGHT)))
        if quota is not None:
            _write(cpu / "cpu.cfs_period_us", _CPU_PERIOD_US)
            _write(cpu / "cpu.cfs_quota_us", quota)

    def pids(self) -> set[int]:
        found: set[int] = set()
        for path in self._dirs:
            with contextlib.suppress(OSError, ValueError):
                found.update(int(line) for line in (path / "cgroup.procs").read_text().split())
        return found

    def kill(self, *, deadline_s: float) -> bool:
        """SIGKILL everything in the group; True once it is empty (see the module docstring)."""
        for path in self._dirs:
            # No new process from here on (v1: forks fail; v2: the kernel kills the whole group itself).
            if self.version == 2:
                _write_optional(path / "cgroup.kill", 1)
            else:
                _write_optional(path / "pids.max", 0)
        end = time.monotonic() + deadline_s
        while True:
            left = self.pids()
            if not left:
                return True
            for pid in left:
                self._kill_checked(pid)
            if time.monotonic() >= end:
                log.error("sandbox cgroup %s still has processes %s", self._dirs[0].name, sorted(left)[:10])
                return False
            time.sleep(0.002)  # killed processes leave the group as they are reaped by their parents

    def _kill_checked(self, pid: int) -> None:
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return  # gone already
        try:
            if self._holds(pid):  # checked after the pidfd pinned the process: a reused pid is never hit
                signal.pidfd_send_signal(fd, signal.SIGKILL)
        except OSError:
            pass
        finally:
            os.close(fd)

    def _holds(self, pid: int) -> bool:
        names = {f"/{path.name}" for path in self._dirs}
        try:
            lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        except OSError:
            return False
        return any(line.endswith(name) for line in lines for name in names)

    def hits(self) -> list[str]:
        """Which limits the kernel enforced, in words (empty when none)."""
        if self.version == 2:
            return limit_hits(2, self._dirs[0], self._dirs[0])
        return limit_hits(1, self.paths["memory"], self.paths["pids"])

    def remove(self) -> bool:
        removed = True
        for path in self._dirs:
            try:
                path.rmdir()
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.error("cannot remove sandbox cgroup %s: %s", path, exc)
                removed = False
        return removed


def _own_groups() -> dict[str, str]:
    """Controller (v2: "") -> this process's group path, from /proc/self/cgroup."""
    out: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                out[controller] = path
    return out


def _v2(own: str | None) -> Cgroups | None:
    for mount in (_ROOT, _ROOT / "unified"):
        if own is None or not (mount / "cgroup.controllers").is_file():
            continue
        parent = mount / own.lstrip("/")
        try:
            enabled = set((parent / "cgroup.subtree_control").read_text().split())
        except OSError:
            continue
        if set(_CONTROLLERS) <= enabled:
            return Cgroups(2, {controller: parent for controller in _CONTROLLERS})
    return None


def _v1(own: dict[str, str]) -> Cgroups | None:
    parents = {}
    for controller in _CONTROLLERS:
        mount = _ROOT / controller
        if controller not in own or not (mount / "cgroup.procs").is_file():
            return None
        parents[controller] = mount / own[controller].lstrip("/")
    return Cgroups(1, parents)


def _write(path: Path, value: object) -> None:
    with open(path, "w") as fh:
        fh.write(f"{value}\n")


def _write_optional(path: Path, value: object) -> None:
    """Write where the kernel has the file (swap accounting, cgroup.kill are not everywhere)."""
    with contextlib.suppress(FileNotFoundError, PermissionError):
        _write(path, value)
