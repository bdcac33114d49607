"""File operations on a sandbox's host directories, confined to them (used by the local backend).

`HostMounts` maps sandbox paths (what commands see, e.g. `/workspace/a.py`) to host paths under the
sandbox root, and refuses anything that would resolve outside the mapped directory: `..`, unmapped
absolute paths, and symlinks pointing out (including in-sandbox absolute symlinks, whose target the host
cannot interpret). Parents created here are chowned to the sandbox's uid so its processes can use them.
What is at a path is untrusted: files are read and created through `hostio` (no FIFO waited on, no symlink
followed, reads capped) and trees removed by `treeops` (iterative, any depth).
"""

from __future__ import annotations

import os
import posixpath
import stat
from collections.abc import Iterable
from pathlib import Path

from coding_agent_env.errors import SandboxFileError, SandboxFileNotFoundError
from coding_agent_env.sandbox.base import FileEntry, over_read_cap, read_cap
from coding_agent_env.sandbox.launcher.inside.treeops import remove_tree
from coding_agent_env.sandbox.local import hostio

__all__ = ["HostMounts", "remove_if_empty", "remove_tree"]


class HostMounts:
    """Sandbox path -> host path, for a fixed set of (sandbox dir, host dir) pairs."""

    def __init__(
        self, mounts: dict[str, Path], workdir: str, owner: tuple[int, int] | None, *, canonical: bool = False
    ) -> None:
        """`canonical`: the caller vouches that the host directories are already absolute, without symlinks
        (it just made them under a resolved root), so they are not resolved again here."""
        self._mounts = {posixpath.normpath(k): v if canonical else Path(os.path.realpath(v)) for k, v in mounts.items()}
        self._workdir = workdir
        self._owner = owner

    def _split(self, path: str) -> tuple[Path, Path]:
        """(host root of the mount, host path) for a sandbox path, lexically confined."""
        if "\x00" in path:
            raise SandboxFileError("path contains a NUL byte")
        full = path if path.startswith("/") else posixpath.join(self._workdir, path)
        full = posixpath.normpath(full)
        for prefix, host_root in sorted(self._mounts.items(), key=lambda kv: -len(kv[0])):
            if full == prefix or full.startswith(prefix + "/"):
                rel = full[len(prefix) :].lstrip("/")
                return host_root, host_root / rel if rel else host_root
        raise SandboxFileError(f"{path!r} is outside the sandbox's writable directories")

    @staticmethod
    def _inside(host_root: Path, candidate: str) -> bool:
        return candidate == str(host_root) or candidate.startswith(str(host_root) + os.sep)

    def resolve_existing(self, path: str) -> Path:
        """Host path of an existing file whose every symlink stays inside its mount."""
        host_root, host = self._split(path)
        if not os.path.lexists(host):
            raise SandboxFileNotFoundError(f"no such file in the sandbox: {path!r}")
        real = os.path.realpath(host)
        if not self._inside(host_root, real):
            raise SandboxFileError(f"{path!r} resolves outside the sandbox")
        return Path(real)

    def host_path(self, path: str) -> Path:
        """Host path for a sandbox path, whose parent (if it exists) stays inside the mount."""
        host_root, host = self._split(path)
        parent = os.path.realpath(host.parent) if host != host_root else str(host_root)
        if not self._inside(host_root, parent):
            raise SandboxFileError(f"{path!r} resolves outside the sandbox")
        return Path(parent) / host.name if host != host_root else host_root

    def read(self, path: str, max_bytes: int | None, tail: bool) -> bytes:
        """At most `read_cap(max_bytes)` bytes of the regular file at `path` (see `hostio.open_regular`: a
        symlink there is not followed, a FIFO never waited on). Blocking as regular file I/O is: call it off the
        event loop."""
        host_root, _ = self._split(path)
        fd = hostio.open_regular(self.host_path(path), host_root, path)
        try:
            data = hostio.read_fd(fd, read_cap(max_bytes), tail)
        except OSError as exc:
            raise SandboxFileError(f"cannot read {path!r}: {exc.strerror}") from exc
        finally:
            os.close(fd)
        return over_read_cap(path, data, max_bytes)

    def write(self, path: str, data: bytes, mode: int) -> None:
        """Write `data` to a new file at `path` (what was there, unless a directory, is replaced: see
        `hostio.create_file`)."""
        fd = self.create(path, mode)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except OSError as exc:
            raise SandboxFileError(f"cannot write {path!r}: {exc.strerror}") from exc
        finally:
            os.close(fd)

    def create(self, path: str, mode: int, *, append: bool = False) -> int:
        """A new empty file at `path` (parents made), open for writing; the caller closes it."""
        host_root, _ = self._split(path)
        host = self.host_path(path)
        if host == host_root:
            raise SandboxFileError(f"cannot write over the directory {path!r}")
        self._makedirs(host_root, host.parent)
        return hostio.create_file(host, mode, self._owner, shown=path, append=append)

    def mkdir(self, path: str) -> None:
        host_root, _ = self._split(path)
        host = self.host_path(path)
        self._makedirs(host_root, host)

    def _makedirs(self, host_root: Path, directory: Path) -> None:
        missing: list[Path] = []
        cursor = directory
        while not cursor.exists() and cursor != host_root:
            if cursor.is_symlink():
                raise SandboxFileError(f"dangling symlink in path: {cursor.name!r}")
            missing.append(cursor)
            cursor = cursor.parent
        if not cursor.is_dir():
            raise SandboxFileError(f"{cursor.name!r} is not a directory")
        for new_dir in reversed(missing):
            os.mkdir(new_dir, 0o755)
            if self._owner is not None:
                os.chown(new_dir, *self._owner)

    def remove(self, path: str) -> None:
        """Remove a file, symlink or tree (never followed, any depth: `treeops`). Unbounded work on a tree:
        call it off the event loop."""
        host_root, _ = self._split(path)
        host = self.host_path(path)
        if host == host_root:
            raise SandboxFileError(f"refusing to remove the mount root {path!r}")
        try:
            remove_tree(host)
        except OSError as exc:
            raise SandboxFileError(f"cannot remove {path!r}: {exc.strerror or exc}") from exc

    def list(self, path: str, max_entries: int) -> tuple[list[FileEntry], bool]:
        top = self.resolve_existing(path)
        if not top.is_dir():
            raise SandboxFileError(f"{path!r} is not a directory")
        entries: list[FileEntry] = []
        stack = [""]
        while stack:
            rel_dir = stack.pop()
            try:
                with os.scandir(top / rel_dir if rel_dir else top) as it:
                    children = sorted(it, key=lambda e: e.name)
            except OSError:
                continue  # unreadable directory: nothing to list inside it
            subdirs = []
            for child in children:
                rel = f"{rel_dir}/{child.name}" if rel_dir else child.name
                if len(entries) >= max_entries:
                    return entries, True
                st = child.stat(follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    entries.append(FileEntry(rel, "symlink", 0))
                elif stat.S_ISDIR(st.st_mode):
                    entries.append(FileEntry(rel, "dir", 0))
                    subdirs.append(rel)
                elif stat.S_ISREG(st.st_mode):
                    entries.append(FileEntry(rel, "file", st.st_size))
                else:
                    entries.append(FileEntry(rel, "other", 0))
            stack.extend(reversed(subdirs))
        return entries, False


def remove_if_empty(root: Path, subdirs: Iterable[str]) -> bool:
    """Remove `root` made with `subdirs` if they are all empty: rmdir each, then the root, stopping at the first
    that fails (not empty, not a directory any more, gone). True when `root` is gone. A handful of system
    calls whatever the sandbox left: bounded work. Subdirectories are tried in reverse, the first (a workdir)
    being the one most likely to hold files."""
    try:
        for sub in reversed(list(subdirs)):
            os.rmdir(root / sub)
        os.rmdir(root)
    except OSError:
        return False
    return True
