"""File operations on a sandbox's host directories, confined to them (used by the local backend).

`HostMounts` maps sandbox paths (what commands see, e.g. `/workspace/a.py`) to host paths under the
sandbox root, and refuses anything that would resolve outside the mapped directory: `..`, unmapped
absolute paths, and symlinks pointing out (including in-sandbox absolute symlinks, whose target the host
cannot interpret). Parents created here are chowned to the sandbox's uid so its processes can use them.
"""

from __future__ import annotations

import errno
import os
import posixpath
import shutil
import stat
from collections.abc import Iterable
from pathlib import Path

from coding_agent_env.errors import SandboxFileError, SandboxFileNotFoundError
from coding_agent_env.sandbox.base import FileEntry

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
        host = self.resolve_existing(path)
        try:
            with open(host, "rb") as fh:
                if max_bytes is None:
                    return fh.read()
                if tail:
                    fh.seek(max(0, os.fstat(fh.fileno()).st_size - max_bytes))
                return fh.read(max_bytes)
        except IsADirectoryError as exc:
            raise SandboxFileError(f"{path!r} is a directory") from exc
        except OSError as exc:
            raise SandboxFileError(f"cannot read {path!r}: {exc.strerror}") from exc

    def write(self, path: str, data: bytes, mode: int) -> None:
        host_root, _ = self._split(path)
        host = self.host_path(path)
        self._makedirs(host_root, host.parent)
        if host.is_symlink():
            host.unlink()
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(host, flags, mode)
        except OSError as exc:
            raise SandboxFileError(f"cannot write {path!r}: {exc.strerror}") from exc
        try:
            os.fchmod(fd, mode)
            if self._owner is not None:
                os.fchown(fd, *self._owner)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)

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
        host_root, _ = self._split(path)
        host = self.host_path(path)
        if host == host_root:
            raise SandboxFileError(f"refusing to remove the mount root {path!r}")
        if host.is_symlink() or (host.exists() and not host.is_dir()):
            host.unlink()
        elif host.is_dir():
            remove_tree(host)

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


def remove_tree(root: Path) -> None:
    """rmtree that also gets through directories a sandboxed process made unwritable."""

    def fix_and_retry(func: object, failed: str, exc_info: tuple[type, BaseException, object]) -> None:
        exc = exc_info[1]
        if isinstance(exc, FileNotFoundError):
            return
        if isinstance(exc, PermissionError) or getattr(exc, "errno", None) == errno.EACCES:
            parent = os.path.dirname(failed)
            os.chmod(parent, 0o700)
            if os.path.isdir(failed) and not os.path.islink(failed):
                os.chmod(failed, 0o700)
                shutil.rmtree(failed, onerror=fix_and_retry)
            else:
                os.unlink(failed)
            return
        raise exc

    if os.path.lexists(root):
        shutil.rmtree(root, onerror=fix_and_retry)
