"""What a local sandbox's spec asks of its layout and users (`SandboxSpec.workdir`, `writable_roots`, `tests`,
`users`), checked before anything is made, and the user namespace a sandbox with users runs in.

Layout: under bubblewrap the workspace's host directory is bound at the spec's workdir (`/app`) instead of
`/workspace`, each further writable root is an empty host directory of its own under the sandbox root (inside
its disk budget, owned by the sandbox's uid) bound at its path, and `/tests` (a symlink to `/logs/tests`) is
there only with `spec.tests`. A path on the sandbox's own directories or the system's is refused
(`SandboxUnsupportedError` naming the setting), as is any of these (and `/tests`) in an unisolated sandbox,
which shows the host's paths and cannot show another.

Users (`spec.users`, root server only): the sandbox gets a user namespace of its own, made at create and kept
(by our descriptor) until close, that maps inner ids 0..65535 onto a host range of the sandbox's own
(`RANGE_SIZE` ids from the range pool, `uids.UidPool`: disjoint from every other live sandbox's, never host
root), except inner 1000, which stays the sandbox's own host uid: what its unprivileged user writes is owned
as in any other sandbox. The namespace is made by a process running as the sandbox's uid (so bubblewrap,
started as that uid, may join it: `bwrap --userns`), and root writes its maps (root may map any range).
Inner root has the namespace's capabilities only (a default container's set, `ROOT_CAPS`): it can chown what
is in the sandbox and become any mapped user, while every host file outside its bound directories stays out
of reach (host ids are not mapped, so no capability applies to their files).
"""

from __future__ import annotations

import os
import posixpath
import subprocess
from dataclasses import dataclass

from coding_agent_env.errors import SandboxError, SandboxUnsupportedError
from coding_agent_env.sandbox.base import SandboxSpec

__all__ = [
    "RANGE_SIZE",
    "ROOT_CAPS",
    "Identity",
    "LocalLayout",
    "identity",
    "make_userns",
    "unknown_user_argv",
]

INNER_UID = 1000
RANGE_SIZE = 65536
"""Inner ids mapped in a sandbox with users: 0..65535 (`nobody` is 65534)."""
ROOT_CAPS = (
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW", "CAP_SETGID",
    "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL",
    "CAP_AUDIT_WRITE",
)
"""Inner root's capabilities, in its own user namespace only: a default Docker container's (no CAP_SYS_ADMIN:
no mounts)."""
_OWN = ("/home/sandbox", "/tmp", "/logs", "/tests", "/opt/agents", "/run", "/proc", "/sys", "/dev", "/usr",
        "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
"""Where no task directory can be bound: the sandbox's own directories, the relay's (`/run`), the system's."""
_PASSWD = "/etc/passwd"
"""The user database a sandbox's commands see (bubblewrap shows the host's `/etc`)."""
_MAKE_TIMEOUT_S = 10.0


def _overlaps(a: str, b: str) -> bool:
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


def _claimable(path: str, setting: str, taken: tuple[str, ...]) -> str:
    normal = posixpath.normpath(path) if path.startswith("/") else ""
    if not normal or normal == "/" or normal.startswith("//") or "\x00" in normal:
        raise SandboxUnsupportedError("local", setting, f"{path[:100]!r} is not an absolute path below /")
    for other in taken:
        if _overlaps(normal, other):
            raise SandboxUnsupportedError("local", setting, f"{normal!r} overlaps {other!r}, which is not the task's")
    return normal


@dataclass(frozen=True)
class LocalLayout:
    """What of its layout a spec asks (checked): the workdir (None: the sandbox's own), further writable roots
    (sandbox path, host subdirectory name under the root), whether `/tests` is shown, whether it has users."""

    workdir: str | None = None
    roots: tuple[tuple[str, str], ...] = ()
    tests: bool = False
    users: bool = False

    @classmethod
    def of(cls, spec: SandboxSpec, *, isolated: bool) -> LocalLayout:
        """`SandboxUnsupportedError` naming the setting for what cannot be honoured (`isolated`: bubblewrap)."""
        if not isolated:
            why = ("without bubblewrap (isolation none or landlock), commands run in the sandbox's host directories, "
                   "which cannot be shown at another path")
            if spec.tests:  # named first: a Harbor task's hidden tests are what such a sandbox lacks most
                raise SandboxUnsupportedError("local", "tests", f"{why}: it cannot show hidden tests at /tests")
            if spec.workdir is not None:
                raise SandboxUnsupportedError("local", "workdir", f"{why} (not at {spec.workdir[:100]!r})")
            if spec.writable_roots:
                raise SandboxUnsupportedError("local", "writable_roots", why)
            if spec.users:
                raise SandboxUnsupportedError("local", "users", "without bubblewrap, commands run as one host user, "
                                                                 "never as root or another user")
            return cls()
        workdir = None if spec.workdir is None else _claimable(spec.workdir, "workdir", _OWN)
        roots: list[str] = []
        for root in spec.writable_roots:
            taken = (*_OWN, workdir or "/workspace", *roots)
            roots.append(_claimable(root, "writable_roots", taken))
        return cls(workdir, tuple((root, f"root-{i}") for i, root in enumerate(roots)), spec.tests, spec.users)

    @property
    def subdirs(self) -> tuple[str, ...]:
        """The host subdirectories of the further roots."""
        return tuple(sub for _, sub in self.roots)


@dataclass(frozen=True)
class Identity:
    """Who a command runs as in a sandbox with users (inner ids); root gets `ROOT_CAPS`."""

    uid: int
    gid: int

    @property
    def root(self) -> bool:
        return self.uid == 0


DEFAULT = Identity(INNER_UID, INNER_UID)


def identity(user: str, passwd: str = _PASSWD) -> Identity | str:
    """The inner ids of `user` (a name or a uid) from the sandbox's user database; a uid it does not name runs
    with its own number as group. A message (str) when there is no such user or it is not mapped."""
    entries: dict[str, tuple[int, int]] = {}
    by_uid: dict[int, int] = {}
    try:
        with open(passwd, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                fields = line.rstrip("\n").split(":")
                if len(fields) >= 4 and fields[2].isdigit() and fields[3].isdigit():
                    entries.setdefault(fields[0], (int(fields[2]), int(fields[3])))
                    by_uid.setdefault(int(fields[2]), int(fields[3]))
    except OSError:
        pass
    if user.isdigit():
        uid = int(user)
        found = (uid, by_uid.get(uid, uid))
    elif user in entries:
        found = entries[user]
    else:
        return f"no user {user!r} in this sandbox"
    if not all(0 <= value < RANGE_SIZE for value in found):
        return f"user {user!r} ({found[0]}:{found[1]}) is not mapped in this sandbox (0..{RANGE_SIZE - 1})"
    return Identity(*found)


_UNKNOWN = 'printf "%s\\n" "$1" >&2; exit 127'


def unknown_user_argv(shell: str, message: str) -> list[str]:
    """A command that says `message` on stderr and exits 127 (an unknown user: nothing of the caller's runs)."""
    return [shell, "-c", _UNKNOWN, "cae-user", message]


def id_map(own_uid: int, base: int) -> str:
    """Inner 0..65535 onto `base`.. (the sandbox's range), but inner 1000 onto its own host uid."""
    return (f"0 {base} {INNER_UID}\n{INNER_UID} {own_uid} 1\n"
            f"{INNER_UID + 1} {base + INNER_UID + 1} {RANGE_SIZE - INNER_UID - 1}\n")


def make_userns(own_uid: int, base: int) -> int:
    """A new user namespace owned by `own_uid`, with `id_map` for users and groups; our descriptor of it
    (close-on-exec). Blocking (a process is started): call it off the event loop. As root only."""
    try:
        holder = subprocess.Popen(
            ["unshare", "--user", "--", "/bin/sh", "-c", "echo ready; read _"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={"PATH": "/usr/bin:/bin"},
            cwd="/", user=own_uid, group=own_uid, extra_groups=[], start_new_session=True,
        )
    except OSError as exc:
        raise SandboxError(f"cannot start unshare (util-linux) for the sandbox's user namespace: {exc}") from exc
    assert holder.stdin is not None and holder.stdout is not None and holder.stderr is not None
    try:
        if holder.stdout.readline() != b"ready\n":
            why = holder.stderr.read(500).decode(errors="replace").strip() or "unshare said nothing"
            raise SandboxError(f"cannot make the sandbox's user namespace: {why}")
        mapping = id_map(own_uid, base)
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{holder.pid}/{name}", "w") as fh:
                fh.write(mapping)
        return os.open(f"/proc/{holder.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise SandboxError(f"cannot map the sandbox's user namespace: {exc.strerror or exc}") from exc
    finally:
        holder.stdin.close()
        try:
            holder.wait(_MAKE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait()
        holder.stdout.close()
        holder.stderr.close()
