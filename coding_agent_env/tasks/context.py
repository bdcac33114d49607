"""A Harbor task's build context (its `environment/` directory): its content hash (the image's tag), and the
archive it travels in to a server that builds it (`POST /images`).

The hash covers each regular file's relative path, executable bit and bytes, so the same directory gives the
same tag wherever it is hashed: the batch runner names the image it asks for, the server names the image it
builds, and they agree. `pack` makes a deterministic gzipped tar of the directory (regular files and
directories only, links never followed, no owners, no times). `unpack` extracts one from a client as a stream,
decompressing only as far as it extracts (`tasks.inflate`), with Python's `data` extraction filter (no absolute
paths, no `..`, no links, no devices) and running caps on the unpacked size, the member count and the
compression ratio: the first cap crossed refuses the archive (`ContextTooLargeError`) at once, so a gzip bomb
costs no more than the caps allow; anything else unacceptable is a `ContextError`.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from coding_agent_env.tasks.confined import open_regular, walk_files
from coding_agent_env.tasks.inflate import BoundedInflate, InflateError, InflateLimitError

__all__ = ["TAG_PREFIX", "ContextError", "ContextTooLargeError", "UnpackCaps", "content_hash", "image_tag", "pack",
           "unpack"]

TAG_PREFIX = "coding-agent-env-task"
_TAR_BLOCK = 512
_HASH_CHUNK = 1 << 20


class ContextError(ValueError):
    """A build context archive that is refused: the message says why."""


class ContextTooLargeError(ContextError):
    """A build context refused because it crossed a cap (size, members, compression ratio); `decompressed` is how
    many bytes had been decompressed when it was refused (the work it cost)."""

    def __init__(self, message: str, decompressed: int) -> None:
        super().__init__(message)
        self.decompressed = decompressed


@dataclass(frozen=True)
class UnpackCaps:
    """What `unpack` accepts; each is checked as the archive is read, never after."""

    max_bytes: int
    """The members' total size, unpacked."""
    max_members: int = 20_000
    max_ratio: float = 200.0
    """Decompressed bytes per compressed byte. Source trees compress 3-10:1; gzip's ceiling (a run of one byte)
    is about 1000:1, which is what a bomb uses."""
    ratio_grace: int = 8 << 20
    """The ratio is only checked past this many decompressed bytes: a small context of zeros is no threat."""

    @property
    def max_stream(self) -> int:
        """The tar stream's own cap: the members' bytes plus, per member, a header, an extended header and the
        padding to a block (so a forged header cannot make the reader buffer more)."""
        return self.max_bytes + (self.max_members + 2) * 3 * _TAR_BLOCK


def content_hash(root: Path) -> str:
    """SHA-256 over every regular file under `root` (links not followed): its relative path, executable bit and
    bytes."""
    digest = hashlib.sha256()
    for rel, path, info in walk_files(root):
        if info is None or not stat.S_ISREG(info.st_mode):
            continue
        digest.update(rel.encode() + b"\0")
        digest.update(b"x" if info.st_mode & 0o111 else b"-")
        file_digest = hashlib.sha256()
        with open_regular(path, rel) as handle:
            while chunk := handle.read(_HASH_CHUNK):
                file_digest.update(chunk)
        digest.update(file_digest.digest())
    return digest.hexdigest()


def image_tag(digest: str) -> str:
    return f"{TAG_PREFIX}:{digest[:32]}"


def pack(root: Path) -> bytes:
    """`root`'s regular files and directories as a gzipped tar, the same bytes for the same content (links are
    left out, never followed)."""
    buffer = io.BytesIO()
    # gzip's header carries a time (tarfile's "w:gz" writes the current one): zero it, for the same bytes.
    with gzip.GzipFile(fileobj=buffer, mode="wb", compresslevel=6, mtime=0) as zipped, \
            tarfile.open(fileobj=zipped, mode="w") as archive:
        for rel, path, info in walk_files(root):
            if info is None:
                continue
            entry = tarfile.TarInfo(rel)
            entry.mtime, entry.uid, entry.gid, entry.uname, entry.gname = 0, 0, 0, "", ""
            if stat.S_ISDIR(info.st_mode):
                entry.type, entry.mode = tarfile.DIRTYPE, 0o755
                archive.addfile(entry)
                continue
            with open_regular(path, rel) as handle:
                entry.size = info.st_size
                entry.mode = 0o755 if info.st_mode & 0o111 else 0o644
                archive.addfile(entry, handle)
    return buffer.getvalue()


def unpack(data: bytes, dest: Path, caps: UnpackCaps | int) -> None:
    """Extract a context archive (a tar, gzipped or not) into the empty directory `dest`, as a stream.

    `ContextTooLargeError` as soon as a cap of `caps` (or, given an int, that many unpacked bytes with the default
    other caps) is crossed; `ContextError` for an archive that is malformed, leaves `dest`, or holds links or
    special files. What was extracted before a refusal stays in `dest` (the caller removes it)."""
    caps = caps if isinstance(caps, UnpackCaps) else UnpackCaps(caps)
    stream = BoundedInflate(data, max_bytes=caps.max_stream, max_ratio=caps.max_ratio, ratio_grace=caps.ratio_grace)
    try:
        # "r|": a stream, read in order; nothing is decompressed ahead of the member being extracted.
        with tarfile.open(fileobj=stream, mode="r|") as archive:
            archive.extractall(dest, members=_checked(archive, caps, stream), filter="data")
    except InflateLimitError as exc:
        raise ContextTooLargeError(str(exc), exc.decompressed) from None
    except InflateError as exc:
        raise ContextError(str(exc)) from None
    except tarfile.FilterError as exc:
        raise ContextError(f"refused entry: {exc}") from None
    except (tarfile.TarError, EOFError) as exc:
        raise ContextError(f"not a readable tar archive: {exc}") from None
    except OSError as exc:
        raise ContextError(f"cannot unpack it: {exc.strerror or exc}") from None


def _checked(archive: tarfile.TarFile, caps: UnpackCaps, stream: BoundedInflate) -> Iterator[tarfile.TarInfo]:
    """The archive's members, each refused (before its data is read) when it is not a regular file or directory
    or takes the count or the total size over the caps."""
    members = total = 0
    for member in archive:
        members += 1
        if members > caps.max_members:
            raise ContextTooLargeError(f"more than {caps.max_members} entries (refused after decompressing "
                                       f"{stream.decompressed} bytes)", stream.decompressed)
        if not (member.isfile() or member.isdir()):
            raise ContextError(f"{member.name!r} is not a regular file or directory")
        total += member.size
        if total > caps.max_bytes:
            raise ContextTooLargeError(f"unpacks to more than {caps.max_bytes} bytes (refused after "
                                       f"decompressing {stream.decompressed} bytes)", stream.decompressed)
        yield member
