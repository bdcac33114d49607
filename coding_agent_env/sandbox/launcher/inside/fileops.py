"""The launcher's file modes: `list`, `stat`, `read`, `prepare` and `remove` (see `launcher.py`). Standard
library only; copied into sandboxes with the launcher."""

from __future__ import annotations

import os
import stat
import sys


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISDIR(mode):
        return "dir"
    return "file" if stat.S_ISREG(mode) else "other"


def listing(top: str, max_entries: int) -> int:
    import json

    entries: list[list[object]] = []
    stack, cut = [""], False
    while stack and not cut:
        rel_dir = stack.pop()
        try:
            names = sorted(os.listdir(os.path.join(top, rel_dir) if rel_dir else top))
        except OSError:
            continue
        subdirs = []
        for name in names:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            if len(entries) >= max_entries:
                cut = True
                break
            st = os.lstat(os.path.join(top, rel))
            kind = _kind(st.st_mode)
            entries.append([rel, kind, st.st_size if kind == "file" else 0])
            if kind == "dir":
                subdirs.append(rel)
        stack.extend(reversed(subdirs))
    json.dump({"entries": entries, "cut": cut}, sys.stdout)
    return 0


def stat_path(path: str) -> int:
    import json

    if not os.path.lexists(path):
        json.dump({"real": None}, sys.stdout)
        return 0
    real = os.path.realpath(path)
    kind = _kind(os.lstat(real).st_mode) if os.path.lexists(real) else "missing"
    json.dump({"real": real, "kind": kind}, sys.stdout)
    return 0


NOT_REGULAR = 3
"""`read`'s exit code for a path that is not a regular file (a FIFO, socket, device, directory, symlink)."""
MISSING = 4
"""`read`'s exit code for a path that does not exist."""


def read_slice(path: str, max_bytes: int, end: str) -> int:
    """Print, base64-encoded, at most `max_bytes` of the regular file `path`: its head, or its tail with
    `end` "tail". Opened without following a symlink and without blocking (a FIFO opens at once), then checked
    to be a regular file: anything else exits `NOT_REGULAR`, a missing path `MISSING`."""
    import base64
    import errno

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        print(f"no such file: {path}", file=sys.stderr)
        return MISSING
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.ENODEV, errno.EISDIR):
            print(f"not a regular file: {path}", file=sys.stderr)
            return NOT_REGULAR
        raise
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            print(f"not a regular file: {path}", file=sys.stderr)
            return NOT_REGULAR
        if end == "tail":
            handle.seek(max(os.fstat(fd).st_size - max_bytes, 0))
        data = handle.read(max_bytes)
    sys.stdout.write(base64.b64encode(data).decode("ascii"))
    return 0


def prepare(path: str, root: str, uid: int | None) -> int:
    """Make every directory between `root` and PATH's parent real (a symlink or file there is replaced,
    never followed), then remove whatever is at PATH itself unless a regular file or a directory: a symlink
    (the engine's write would follow it), a FIFO (its open would wait for a reader forever), a socket or a
    device."""
    rel = os.path.relpath(os.path.dirname(path), root)
    current = root
    for part in [] if rel == "." else rel.split("/"):
        current = os.path.join(current, part)
        if os.path.islink(current) or (os.path.lexists(current) and not os.path.isdir(current)):
            os.unlink(current)
        if not os.path.lexists(current):
            os.mkdir(current, 0o755)
            if uid is not None:
                os.chown(current, uid, uid)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return 0
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        os.unlink(path)
    return 0


def remove(path: str, root: str) -> int:
    """Remove PATH (a tree, a file or a symlink, never followed) below ROOT, as whoever runs this (root: an
    agent's mode-000 directories are no obstacle). Every directory from ROOT down to PATH's parent is opened
    with O_NOFOLLOW, so a symlink the sandbox user planted there fails the removal instead of redirecting it;
    the tree is then removed through that pinned parent (`treeops`: iterative, any depth, no symlink
    followed). Missing: not an error."""
    import treeops

    rel = os.path.relpath(path, root)
    if rel == "." or rel.startswith("..") or os.path.isabs(rel):
        print(f"refusing to remove {path!r}", file=sys.stderr)
        return 2
    *parents, name = rel.split("/")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parents:
            try:
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except FileNotFoundError:
                return 0
            except OSError as exc:
                print(f"cannot remove {path!r}: {part!r} is not a real directory ({exc.strerror})", file=sys.stderr)
                return 1
            os.close(fd)
            fd = nxt
        try:
            # The pinned parent by its descriptor: whatever is renamed meanwhile, the removal stays in it.
            treeops.remove_tree(f"/proc/self/fd/{fd}/{name}")
        except OSError as exc:
            print(f"cannot remove {path!r}: {exc}", file=sys.stderr)
            return 1
    finally:
        os.close(fd)
    return 0
