"""Tar streams for the Docker archive API: building uploads, reading one file back within a byte budget."""

from __future__ import annotations

import collections
import io
import posixpath
import tarfile
from collections.abc import Iterable, Iterator

__all__ = ["GO_MODE_DIR", "ChunkReader", "dir_entries_tar", "file_tar", "read_member", "split_root", "tree_tar"]

GO_MODE_DIR = 1 << 31
"""`os.ModeDir` in the archive API's stat header (Go's FileMode)."""


def _dir_info(name: str, uid: int, mode: int = 0o755) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, mode, uid, uid
    return info


def _parents(rel: str) -> list[str]:
    parts = rel.split("/")
    return ["/".join(parts[: i + 1]) for i in range(len(parts) - 1)]


def dir_entries_tar(rel_dirs: Iterable[str], uid: int) -> bytes:
    """A tar that creates each relative directory (and its parents) owned by `uid`."""
    buf = io.BytesIO()
    seen: set[str] = set()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in rel_dirs:
            for name in [*_parents(rel), rel]:
                if name and name not in seen:
                    seen.add(name)
                    tar.addfile(_dir_info(name, uid))
    return buf.getvalue()


def file_tar(rel: str, data: bytes, *, mode: int, uid: int, parents: bool = True) -> bytes:
    """A tar holding `rel` (relative to the extraction root) and, with `parents`, its parent directories."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        if parents:
            for name in _parents(rel):
                tar.addfile(_dir_info(name, uid))
        info = tarfile.TarInfo(rel)
        info.size, info.mode, info.uid, info.gid = len(data), mode, uid, uid
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class ChunkReader(io.RawIOBase):
    """A readable file over an iterator of byte chunks (the archive API's response stream)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buf = b""

    def readable(self) -> bool:
        return True

    def readinto(self, target: bytearray) -> int:  # type: ignore[override]
        while not self._buf:
            try:
                self._buf = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(target), len(self._buf))
        target[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


def read_member(chunks: Iterator[bytes], max_bytes: int, tail: bool) -> bytes | None:
    """The first regular file of a tar stream, cut to `max_bytes` (its first or, with `tail`, last bytes).
    None when the first member is not a regular file (a FIFO, device, symlink, hard link or directory entry:
    its header alone says so, nothing of it is read). Memory stays within `max_bytes`."""
    with tarfile.open(fileobj=io.BufferedReader(ChunkReader(chunks)), mode="r|") as tar:
        member = tar.next()
        if member is None or member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
            return None
        fh = tar.extractfile(member)
        assert fh is not None
        if not tail:
            return fh.read(max_bytes)
        window: collections.deque[bytes] = collections.deque()
        kept = 0
        while chunk := fh.read(64 * 1024):
            window.append(chunk)
            kept += len(chunk)
            while kept - len(window[0]) >= max_bytes:
                kept -= len(window.popleft())
        return b"".join(window)[-max_bytes:] if max_bytes else b""


def tree_tar(dirs: dict[str, tuple[int, int]], files: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    """A tar of directories (`name: (uid, mode)`, parents before children), files (mode 0644, root's) and
    symlinks (`name: target`)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, (uid, mode) in dirs.items():
            tar.addfile(_dir_info(name, uid, mode))
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return buf.getvalue()


def split_root(root: str, full: str) -> str:
    """`full` relative to `root` ('' for the root itself)."""
    return "" if full == root else posixpath.relpath(full, root)
