"""Removing a directory tree a sandbox made, whatever its depth: iteratively, by file descriptor, never following
a symlink. Standard library only and importing nothing from this package: the launcher copies it into
sandboxes (its `procs` removes fresh directories with it), and the host imports it as
`coding_agent_env.sandbox.launcher.inside.treeops` (the local backend's and Docker's cleanups): one remover
for both sides.

Why not `shutil.rmtree`: it recurses (a tree 3000 directories deep raises `RecursionError`) and works on
paths (a tree deeper than PATH_MAX cannot be named at all). Here only one directory is open at a time: the
walk descends with `openat(dir, child, O_NOFOLLOW)` and climbs back with `openat(dir, "..")`, checking that
each parent it climbs to is the very directory it came down from (device and inode); a tree moved under the
walk (a process still running in it) restarts the walk from the top, a bounded number of times.

Permissions a sandboxed process took away (a mode-000 directory, an unwritable parent) are given back to the
owner as the walk meets them, which a non-root server needs (root needs none). Nothing below the top is
crossed into on another filesystem (a mount point cannot be removed anyway: that is reported).
"""

from __future__ import annotations

import errno
import os
import stat

__all__ = ["TreeMovedError", "remove_tree"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_RESTARTS = 64
"""How often a walk starts over when the tree is moved under it before it gives up."""


class TreeMovedError(OSError):
    """The tree kept being moved under the walk (a live process in it): it could not be removed."""


def remove_tree(path: str | os.PathLike[str]) -> None:
    """Remove `path`: a directory tree, a file, a symlink (never followed) or nothing at all (missing is fine).
    Raises `OSError` at the first thing that cannot be removed (a mount point inside, a read-only filesystem,
    an entry of `path`'s own parent the caller may not remove)."""
    path = os.fspath(path)
    parent, name = os.path.split(os.path.normpath(path))
    try:
        parent_fd = os.open(parent or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        for _ in range(_RESTARTS):
            try:
                top = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
            except FileNotFoundError:
                return
            if not stat.S_ISDIR(top.st_mode):
                # The caller's directory: its mode is not ours to change.
                _remove(parent_fd, name, directory=False, fix=False)
                return
            if _remove_dir(parent_fd, name, top.st_dev):
                return
        raise TreeMovedError(errno.EBUSY, f"the tree kept moving while it was removed: {path}")
    finally:
        os.close(parent_fd)


def _remove_dir(top_parent: int, top_name: str, device: int) -> bool:
    """Remove the directory `top_name` of `top_parent` and all below it; False when the tree moved under the
    walk (start again)."""
    try:
        cur = _open_dir(top_parent, top_name)
    except FileNotFoundError:
        return True
    except NotADirectoryError:  # swapped for a file or symlink since it was looked at
        return False
    # Down the path from the top: (name in its parent, (device, inode)) of each directory open so far.
    path: list[tuple[str, tuple[int, int]]] = [(top_name, _identity(cur))]
    try:
        while True:
            child = _clear_files(cur)
            if child is not None:
                try:
                    nxt = _open_dir(cur, child)
                except FileNotFoundError:
                    continue
                except NotADirectoryError:
                    # Swapped for a symlink or file meanwhile: not followed, removed.
                    _remove(cur, child, directory=False)
                    continue
                identity = _identity(nxt)
                if identity[0] != device:
                    os.close(nxt)
                    raise OSError(errno.EXDEV, f"a mount point is in the tree: {child!r}")
                os.close(cur)
                cur = nxt
                path.append((child, identity))
                continue
            name, _ = path.pop()
            if not path:
                os.close(cur)
                cur = -1
                _remove(top_parent, name, directory=True, fix=False)
                return True
            parent = os.open("..", _DIR_FLAGS, dir_fd=cur)
            os.close(cur)
            cur = parent
            if _identity(cur) != path[-1][1]:
                return False  # moved: this is not the directory we came down from
            _remove(cur, name, directory=True)
    finally:
        if cur >= 0:
            os.close(cur)


def _clear_files(dir_fd: int) -> str | None:
    """Unlink every entry of the directory that is not a directory; the name of the first subdirectory met
    (the walk goes down into it next), or None when the directory is empty."""
    fixed = False
    while True:
        with os.scandir(dir_fd) as entries:  # on close, scandir rewinds the descriptor for the next scan
            for entry in entries:
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if is_dir:
                    return entry.name
                try:
                    os.unlink(entry.name, dir_fd=dir_fd)
                except FileNotFoundError:
                    pass
                except PermissionError:
                    if fixed:
                        raise
                    break  # give the directory back its owner's rights, then scan again
            else:
                return None
        os.fchmod(dir_fd, 0o700)
        fixed = True


def _open_dir(dir_fd: int, name: str) -> int:
    """Open directory `name` of `dir_fd` without following a symlink; one its owner cannot read is first given
    back its owner's rights (through an O_PATH descriptor: the mode is changed on that very directory)."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except PermissionError:
        pinned = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            os.chmod(f"/proc/self/fd/{pinned}", 0o700)
        finally:
            os.close(pinned)
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a symlink: O_NOFOLLOW refused it
            raise NotADirectoryError(exc.errno, exc.strerror, name) from None
        raise


def _remove(dir_fd: int, name: str, *, directory: bool, fix: bool = True) -> None:
    """Unlink `name` of `dir_fd` (rmdir with `directory`), gone already or not; with `fix`, an unwritable
    `dir_fd` (in the tree) is given back its owner's rights first."""
    remove = os.rmdir if directory else os.unlink
    try:
        remove(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    except PermissionError:
        if not fix:
            raise
        os.fchmod(dir_fd, 0o700)
        remove(name, dir_fd=dir_fd)


def _identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino
