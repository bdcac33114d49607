"""Opening files a sandbox may have made, on the host, as untrusted input: never blocking, never following a
symlink, never reading past a cap, never leaving the sandbox's directory.

A sandboxed process can put anything at a path the server is about to open: a FIFO (a plain `open()` of it
waits for a writer forever: on the event loop, the whole server stalls), a device, a socket, a symlink to the
operator's files, or a file of gigabytes. Reads here: `lstat` first (a non-regular file is refused without
being opened at all), then `open(O_NOFOLLOW | O_NONBLOCK | O_NOCTTY)` (what was swapped in since neither
blocks nor is followed), `fstat` (still a regular file), and the opened file's own path checked to be inside
the sandbox's directory (a parent directory swapped for a symlink meanwhile is caught). Writes: whatever is not
a regular file at the path is unlinked first and the file is created with `O_EXCL` (no FIFO, symlink or hard
link planted there is ever opened).

Blocking only as a regular file's I/O blocks: callers run reads off the event loop.
"""

from __future__ import annotations

import collections
import errno
import os
import stat
from pathlib import Path

from coding_agent_env.errors import SandboxFileError, SandboxFileNotFoundError, SandboxFileNotRegularError

__all__ = ["create_file", "open_regular", "read_fd"]

_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_CREATE_TRIES = 8
"""How often `create_file` unlinks what a live sandbox keeps putting back at the path before it gives up."""
_CHUNK = 1 << 20
_TAIL_READ_FACTOR = 16
"""A tail read of a file still growing reads at most this many times its bound (or chunk) before it stops."""


def open_regular(host: Path, inside: Path, shown: str) -> int:
    """A read-only descriptor of the regular file at `host`, which must be in the directory `inside`; `shown`
    is the path as errors name it. `SandboxFileNotFoundError`, `SandboxFileNotRegularError` (a symlink
    included), or `SandboxFileError` (outside `inside`, unreadable)."""
    try:
        before = os.lstat(host)
    except FileNotFoundError:
        raise SandboxFileNotFoundError(f"no such file in the sandbox: {shown!r}") from None
    except OSError as exc:
        raise SandboxFileError(f"cannot read {shown!r}: {exc.strerror}") from exc
    if not stat.S_ISREG(before.st_mode):
        raise SandboxFileNotRegularError(f"{shown!r} is not a regular file ({_kind(before.st_mode)})")
    try:
        fd = os.open(host, _READ_FLAGS)
    except FileNotFoundError:
        raise SandboxFileNotFoundError(f"no such file in the sandbox: {shown!r}") from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.ENODEV, errno.EISDIR, errno.ENOTDIR):
            raise SandboxFileNotRegularError(f"{shown!r} is not a regular file") from None
        raise SandboxFileError(f"cannot read {shown!r}: {exc.strerror}") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SandboxFileNotRegularError(f"{shown!r} is not a regular file")
        opened = os.readlink(f"/proc/self/fd/{fd}")
        if not (opened == str(inside) or opened.startswith(str(inside).rstrip("/") + "/")):
            raise SandboxFileError(f"{shown!r} resolves outside the sandbox")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_fd(fd: int, max_bytes: int, tail: bool) -> bytes:
    """At most `max_bytes` of the open regular file `fd`: its first bytes, or its last with `tail` (of what is
    there while it is read: a file still growing is read up to `max_bytes` from where its end was)."""
    if tail:
        size = os.fstat(fd).st_size
        if size > max_bytes:
            os.lseek(fd, size - max_bytes, os.SEEK_SET)
            return _read_up_to(fd, max_bytes)
        # Small when looked at: read on, keeping the last `max_bytes` of whatever it grew to.
        window: collections.deque[bytes] = collections.deque()
        kept = read = 0
        # Bounded: a writer that outlived the command (or outpaces the read) must not keep this thread forever.
        while read < _TAIL_READ_FACTOR * max(max_bytes, _CHUNK) and (chunk := os.read(fd, _CHUNK)):
            window.append(chunk)
            kept += len(chunk)
            read += len(chunk)
            while kept - len(window[0]) >= max_bytes:
                kept -= len(window.popleft())
        return b"".join(window)[-max_bytes:] if max_bytes else b""
    return _read_up_to(fd, max_bytes)


def _read_up_to(fd: int, limit: int) -> bytes:
    parts: list[bytes] = []
    left = limit
    while left > 0:
        chunk = os.read(fd, min(left, _CHUNK))
        if not chunk:
            break
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def create_file(host: Path, mode: int, owner: tuple[int, int] | None, *, shown: str, append: bool = False) -> int:
    """A new, empty regular file at `host` (whose parent the caller made and confined), opened for writing
    (`append`: in append mode), with `mode` and `owner`. A regular file, symlink, FIFO, socket or device
    there is unlinked first, never opened or followed; a directory is `SandboxFileError`."""
    flags = _CREATE_FLAGS | (os.O_APPEND if append else 0)
    for _ in range(_CREATE_TRIES):
        try:
            fd = os.open(host, flags, mode)
        except FileExistsError:
            _unlink_non_dir(host, shown)
            continue
        except OSError as exc:
            raise SandboxFileError(f"cannot write {shown!r}: {exc.strerror}") from exc
        try:
            os.fchmod(fd, mode)
            if owner is not None:
                os.fchown(fd, *owner)
        except BaseException:
            os.close(fd)
            raise
        return fd
    raise SandboxFileError(f"cannot write {shown!r}: something keeps being put back at that path")


def _unlink_non_dir(host: Path, shown: str) -> None:
    try:
        os.unlink(host)
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        raise SandboxFileError(f"cannot write {shown!r}: it is a directory") from None
    except OSError as exc:
        if exc.errno == errno.EPERM and os.path.isdir(host):  # unlink(2) of a directory on Linux
            raise SandboxFileError(f"cannot write {shown!r}: it is a directory") from None
        raise SandboxFileError(f"cannot write {shown!r}: {exc.strerror}") from exc


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symlink, not followed"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a file"
