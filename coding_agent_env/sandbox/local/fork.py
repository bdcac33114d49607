"""Forking a local sandbox: a frozen root (`LocalTemplate`) under per-member overlay mounts.

A template is a set-up sandbox closed without removing its root: its processes killed, its control group and
network namespace gone, its root (a tmpfs) and its host uid kept. A member (`LocalBackend.fork`) is a sandbox
like any other (own root, a tmpfs of its own disk budget, own control group, network namespace and relay),
except that each of its root's directories is an overlayfs mount: the template's directory read-only below,
an upper directory on the member's own tmpfs above. So a fork costs a few mounts whatever the set-up state's
size, the member's writes are its own (and count against its own disk budget), and the template never
changes. Members run as the template's host uid (files written by the setup stay theirs to change); what keeps
members apart is what keeps any two sandboxes apart but the uid: their own mount, pid, ipc and network
namespaces, and their own control group, whose pids limit stands in for RLIMIT_NPROC (which would count all
members together) - hence forking needs a control group per sandbox.

The template's uid goes back to the pool only once it is released and its last member is closed. Removing a
member's root detaches its tmpfs and the overlays on it at once (lazily); the template root's tmpfs lives as
long as an overlay still uses it. After a crash the reaper removes template and member roots alike (both are
`<server pid>-...` roots under the state directory).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import logging
import os
from collections.abc import Callable
from pathlib import Path

from coding_agent_env.sandbox.base import SandboxTemplate
from coding_agent_env.sandbox.local.disk import unmount

__all__ = ["FORK_DIR", "LocalTemplate", "mount_overlay", "overlay_refusal", "used_bytes"]

log = logging.getLogger(__name__)

FORK_DIR = ".fork"
"""Under a member's root: the overlays' upper and work directories (never shown in the sandbox)."""
_MNT_NODEV = 4
_MNT_NOSUID = 2
_UNSAFE = frozenset(",:\\\n")
"""Characters overlayfs's mount options cannot carry unescaped in a directory's path."""
_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def overlay_refusal(state_dir: Path) -> str | None:
    """Why overlays cannot be mounted over roots under `state_dir`, or None."""
    if _UNSAFE & set(os.path.realpath(state_dir)):
        return f"the state directory's path holds a character overlayfs options cannot carry ({sorted(_UNSAFE)})"
    return None


def mount_overlay(lower: Path, root: Path, sub: str, uid: int | None, mode: int) -> None:
    """Mount at `root/sub` an overlay of `lower` (read-only) under an upper directory in `root/FORK_DIR`, owned by
    `uid` with `mode` (the merged directory's own owner and mode are its upper's). OSError when the kernel
    refuses."""
    upper, work = root / FORK_DIR / "up" / sub, root / FORK_DIR / "wk" / sub
    for made in (upper, work):
        made.mkdir(mode=0o700, parents=True)
    os.chmod(root / FORK_DIR, 0o700)
    if uid is not None:
        os.chown(upper, uid, uid)
    os.chmod(upper, mode)
    options = f"lowerdir={lower},upperdir={upper},workdir={work}".encode()
    if _libc.mount(b"cae-fork", os.fsencode(root / sub), b"overlay", _MNT_NODEV | _MNT_NOSUID, options) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount overlay: {os.strerror(err)}")


class LocalTemplate(SandboxTemplate):
    """A frozen local sandbox root (see the module docstring). `give_uid` returns its uid to the pool; `forks`
    counts its members alive."""

    backend = "local"
    method = "overlay"

    def __init__(self, root: Path, uid: int | None, subdirs: tuple[str, ...], give_uid: Callable[[], None]) -> None:
        self.id = root.name
        self.root = root
        self.uid = uid
        self.subdirs = subdirs
        self.modes = {sub: (root / sub).stat().st_mode & 0o7777 for sub in subdirs}
        self._give_uid = give_uid
        self.forks = 0
        self._uid_given = False

    def fork_started(self) -> None:
        self.forks += 1

    def fork_gone(self, _uid: int | None = None) -> None:
        """A member is closed (its processes dead): the uid may go back once no member and no template hold it."""
        self.forks -= 1
        self._maybe_give_uid()

    def _maybe_give_uid(self) -> None:
        if self.released and self.forks == 0 and not self._uid_given:
            self._uid_given = True
            self._give_uid()

    async def _release(self) -> None:
        try:
            # Unmounting its tmpfs frees it at once, or as soon as no member's overlay uses it any more.
            await asyncio.to_thread(functools.partial(_remove, self.root))
        finally:
            self._maybe_give_uid()


def used_bytes(root: Path) -> int:
    """Bytes in use on the file system mounted at `root` (a template's tmpfs: what it holds in memory); 0 when
    `root` is no mount point (its bytes are not its own to count) or cannot be read."""
    try:
        if not os.path.ismount(root):
            return 0
        st = os.statvfs(root)
    except OSError:
        return 0
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def _remove(root: Path) -> None:
    if unmount(root):
        try:
            root.rmdir()
        except OSError as exc:
            log.error("cannot remove group template root %s: %s", root, exc)
