"""The launcher's file modes: `list`, `stat`, `read`, `prepare` and `remove` (see `launcher.py`). Standard
library only; copied into sandboxes with the launcher."""

from __future__ import annotations

import os
import stat
import sys

import procs


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


def read_slice(path: str, max_bytes: int, end: str) -> int:
    """Print, base64-encoded, at most `max_bytes` of the regular file `path`: its head, or its tail with
    `end` "tail". The caller resolved `path`; a symlink put in its place since is not followed."""
    import base64

    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            print(f"not a regular file: {path}", file=sys.stderr)
            return 1
        if end == "tail":
            handle.seek(max(os.fstat(fd).st_size - max_bytes, 0))
        data = handle.read(max_bytes)
    sys.stdout.write(base64.b64encode(data).decode("ascii"))
    return 0


def prepare(path: str, root: str, uid: int | None) -> int:
    """Make every directory between `root` and PATH's parent real (a symlink or file there is replaced,
    never followed), then remove a symlink at PATH itself."""
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
    if os.path.islink(path):
        os.unlink(path)
    return 0


def remove(path: str, root: str) -> int:
    """Remove PATH (a tree, a file or a symlink, never followed) below ROOT, as whoever runs this (root: an
    agent's mode-000 directories are no obstacle). Every directory from ROOT down to PATH's parent is opened
    with O_NOFOLLOW, so a symlink the sandbox user planted there fails the removal instead of redirecting it;
    `rm -rf` (which follows no symlink) then runs in that parent, pinned as its cwd. Missing: not an error."""
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
        child = os.fork()
        if child == 0:
            try:
                os.fchdir(fd)
                procs.default_signals()
                os.execvp("rm", ["rm", "-rf", "--", name])
            finally:
                os._exit(127)
    finally:
        os.close(fd)
    _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code
