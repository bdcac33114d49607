"""What one confined command may reach (`Policy`), as the server writes it and `confine` reads it (stdlib
only: `confine` imports it as a plain file)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

__all__ = ["DEVICES", "Policy", "proc_paths", "system_paths"]

DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
"""The device files every command may read and write (Landlock handles devices like any file)."""
_SYSTEM = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
"""What a bubblewrap sandbox shows of the host (`local.probe.system_args`), here readable in place; /proc is
`proc_paths`."""
_PROC = "/proc"
_PROC_OTHERS = ("self", "thread-self")


def system_paths() -> tuple[str, ...]:
    """The read-only system trees that exist here, merged-/usr symlinks resolved (Landlock rules name the
    directories themselves)."""
    seen: list[str] = []
    for path in _SYSTEM:
        real = os.path.realpath(path)
        if os.path.isdir(real) and real not in seen:
            seen.append(real)
    return tuple(seen)


def proc_paths(pid: int) -> tuple[str, ...]:
    """What a command may read of /proc: its own `/proc/PID` (its descendants' are other directories, not
    granted) and every entry that is not a process's (cpuinfo, meminfo, sys, ...). No PID namespace here: other
    processes' directories (their command lines, the server's and other sandboxes' included) stay unreadable,
    and /proc itself unlistable."""
    names = [name for name in os.listdir(_PROC) if not name.isdigit() and name not in _PROC_OTHERS]
    return (f"{_PROC}/{pid}", *(f"{_PROC}/{name}" for name in names))


@dataclass(frozen=True)
class Policy:
    """`read`: trees readable and executable; `write`: trees with every right (the sandbox's own directories);
    `connect_ports`: the TCP ports it may connect to (`inet` must be set: TCP sockets allowed at all);
    `rlimits`: by `prlimit` name, soft = hard; `cgroup_procs`: files to write `0` to first (the sandbox's control
    groups); `uid`: switched to after those (the server as root), None keeps the caller's."""

    read: tuple[str, ...]
    write: tuple[str, ...]
    devices: tuple[str, ...] = DEVICES
    inet: bool = False
    connect_ports: tuple[int, ...] = ()
    rlimits: dict[str, int] = field(default_factory=dict)
    cgroup_procs: tuple[str, ...] = ()
    uid: int | None = None

    def dumps(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def loads(cls, text: str) -> Policy:
        raw = json.loads(text)
        tuples = {key: tuple(raw[key]) for key in ("read", "write", "devices", "connect_ports", "cgroup_procs") if key in raw}
        return cls(**{**raw, **tuples})
