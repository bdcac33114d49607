"""Host uids for local sandboxes when the server runs as root: one per live sandbox, on the whole host.

A uid is a host resource, not a process's (INTEGRITY 36): two servers, or a server and a CLI rollout, with
overlapping ranges must never run two live sandboxes as one uid (each would read the other's files, and the
close() of one, which ends every process of its uid, would kill the other's). So a uid is held by an exclusive
`flock` on its own lock file, `LOCK_DIR/<uid>.lock`, for as long as its sandbox lives. The kernel drops the
lock when its holder closes it or dies, however it dies: a crashed server leaves no uid taken. A holder removes
its lock file as it gives the uid back (while still holding the lock); a process that opened that file just
before then finds, once it has the lock, that the file is no longer the one at the path, and tries again: the
lock that counts is always the one on the file the path names. (A crashed holder's file stays, unlocked, until
the uid is next taken and given.)

A sandbox with users (`SandboxSpec.users`) also holds a range of host ids for its user namespace (`layout`): a
pool with a `step`, whose members are the ranges' first ids, each held the same way by `LOCK_DIR/range-<first
id>.lock`.
"""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path
from typing import ClassVar

from coding_agent_env.errors import SandboxError

__all__ = ["LOCK_DIR", "UidPool"]

LOCK_DIR = Path("/run/coding-agent-env/uids")
"""Where every server and CLI on this host locks the uids it uses (root's, 0700)."""


class UidPool:
    """The uids `base` .. `base + count - 1`, handed out one per live sandbox, host-wide (see the module
    docstring). `lock_dir`: where the lock files are (default `LOCK_DIR`; only processes sharing it share the
    guarantee). With `step` (and `prefix` for their lock files), the members are `count` ranges of `step` ids
    each, named by their first id."""

    _held: ClassVar[dict[str, int]] = {}
    """lock file name -> the descriptor of its held lock, for every pool of this process."""
    _ledger: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, base: int, count: int, *, lock_dir: Path = LOCK_DIR, step: int = 1, prefix: str = "") -> None:
        self._range = range(base, base + count * step, step)
        self._dir = lock_dir
        self._prefix = prefix

    def _name(self, uid: int) -> str:
        return f"{self._prefix}{uid}.lock"

    def take(self) -> int:
        """The lowest uid of the range no process on this host holds, now held by this one; `SandboxError` when
        all are taken (or the lock directory cannot be made)."""
        with self._ledger:
            self._make_dir()
            for uid in self._range:
                if self._name(uid) in self._held:
                    continue
                fd = self._lock(uid)
                if fd is not None:
                    self._held[self._name(uid)] = fd
                    return uid
        what = "id range" if self._prefix else "uid"
        raise SandboxError(f"no free sandbox {what}: too many local sandboxes alive on this host")

    def give(self, uid: int) -> None:
        """Release `uid` (its sandbox is gone). Unknown or already given: nothing to do."""
        with self._ledger:
            fd = self._held.pop(self._name(uid), None)
        if fd is not None:
            try:
                os.unlink(self._dir / self._name(uid))  # still locked: see the module docstring
            except OSError:
                pass
            os.close(fd)  # closing the only descriptor of its open file drops the lock

    def _make_dir(self) -> None:
        try:
            self._dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise SandboxError(f"cannot make the sandbox uid lock directory {self._dir}: {exc.strerror}") from exc

    def _lock(self, uid: int) -> int | None:
        """The descriptor holding `uid`'s lock, or None when another process (or open file) holds it."""
        path = self._dir / self._name(uid)
        while True:
            try:
                # CLOEXEC: no command the sandbox starts may inherit (and so keep) the lock.
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            except OSError as exc:
                raise SandboxError(f"cannot open the sandbox uid lock {path}: {exc.strerror}") from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return None
            except OSError as exc:
                os.close(fd)
                raise SandboxError(f"cannot lock {path}: {exc.strerror}") from exc
            if _same_file(fd, path):
                return fd
            os.close(fd)  # its holder removed it as it gave the uid back: lock the file now at the path


def _same_file(fd: int, path: Path) -> bool:
    try:
        at_path = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (at_path.st_dev, at_path.st_ino)
