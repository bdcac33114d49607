"""What the kernel's control-group counters say a sandbox ran into: OOM kills at its memory limit, allocations
that found it full, and forks refused at its process limit. Counters, not samples: a fork bomb that ran out of
pids and ended before anyone looked is still counted, for as long as the group exists (its owner reads them
before removing it). Shared by the backends whose sandboxes are control groups on this host (a local
sandbox's own group, a container of a local Docker engine)."""

from __future__ import annotations

import contextlib
from pathlib import Path

__all__ = ["limit_hits", "limit_hits_of_pid"]

_ROOT = Path("/sys/fs/cgroup")


def limit_hits(version: int, memory: Path, pids: Path) -> list[str]:
    """The limits hit by the group whose `memory` and `pids` directories are given (the same one in v2): v2's
    `memory.events` `oom_kill` and `oom` (an allocation that failed at the limit, whether or not a process was
    killed for it), v1's `memory.oom_control` `oom_kill`; `pids.events` `max` in both."""
    if version == 2:
        oom = _counter(memory / "memory.events", "oom_kill")
        failed = _counter(memory / "memory.events", "oom")
    else:
        oom, failed = _counter(memory / "memory.oom_control", "oom_kill"), 0
    forks = _counter(pids / "pids.events", "max")
    found = []
    if oom:
        found.append(f"out of memory: {oom} process(es) killed at the sandbox's memory limit")
    elif failed:
        found.append(f"out of memory: {failed} allocation(s) failed at the sandbox's memory limit")
    if forks:
        found.append(f"process limit: {forks} fork(s) refused at the sandbox's process limit")
    return found


def limit_hits_of_pid(pid: int) -> list[str]:
    """`limit_hits` of the group process `pid` of this host is in (nothing when it cannot be read)."""
    groups: dict[str, str] = {}
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                groups[controller] = path.lstrip("/")
    if "memory" in groups and "pids" in groups:
        return limit_hits(1, _ROOT / "memory" / groups["memory"], _ROOT / "pids" / groups["pids"])
    if "" in groups and (_ROOT / "cgroup.controllers").is_file():
        return limit_hits(2, _ROOT / groups[""], _ROOT / groups[""])
    return []


def _counter(path: Path, key: str) -> int:
    with contextlib.suppress(OSError, ValueError):
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    return 0
