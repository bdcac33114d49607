"""What one confined command may reach (`Policy`), as the server writes it: `args()` are `confine`'s options."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["DEVICES", "Policy", "system_paths"]

DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
"""The device files every command may read and write (Landlock handles devices like any file)."""
_SYSTEM = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
"""What a bubblewrap sandbox shows of the host (`local.probe.system_args`), here readable in place; of /proc,
`confine` grants the command's own entries."""


def system_paths() -> tuple[str, ...]:
    """The read-only system trees that exist here, merged-/usr symlinks resolved (Landlock rules name the
    directories themselves), none inside another."""
    seen: list[str] = []
    for path in _SYSTEM:
        real = os.path.realpath(path)
        if os.path.isdir(real) and not any(real == top or real.startswith(top + "/") for top in seen):
            seen.append(real)
    return tuple(seen)


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
    rlimits: Mapping[str, int] = field(default_factory=dict)
    cgroup_procs: tuple[str, ...] = ()
    uid: int | None = None
    nproc_over_uid: int | None = None
    """Without a uid of its own: RLIMIT_NPROC this many above the tasks the uid has when the command starts."""

    def args(self) -> list[str]:
        """`confine`'s options (each a flag and its value; paths are argv strings, never parsed by a shell)."""
        args: list[str] = []
        for flag, values in (("--read", self.read), ("--write", self.write), ("--device", self.devices),
                             ("--cgroup", self.cgroup_procs)):
            for value in values:
                args += [flag, value]
        args += [arg for port in self.connect_ports for arg in ("--connect", str(port))]
        args += [arg for name, value in self.rlimits.items() for arg in ("--rlimit", f"{name}={value}")]
        if self.inet:
            args += ["--inet", "1"]
        if self.uid is not None:
            args += ["--uid", str(self.uid)]
        if self.nproc_over_uid is not None:
            args += ["--nproc-over-uid", str(self.nproc_over_uid)]
        return args
