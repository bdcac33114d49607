"""A Harbor task's build context (its `environment/` directory): its content hash (the image's tag), and the
archive it travels in to a server that builds it (`POST /images`).

The hash covers each regular file's relative path, executable bit and bytes, so the same directory gives the
same tag wherever it is hashed: the batch runner names the image it asks for, the server names the image it
builds, and they agree. `pack` makes a deterministic gzipped tar of the directory (regular files and
directories only, no owners, no times); `unpack` opens one from a client with Python's `data` extraction filter
(no absolute paths, no `..`, no links leaving the directory, no devices) and bounds on the member count and the
unpacked size, refusing anything else with `ContextError`.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

__all__ = ["TAG_PREFIX", "ContextError", "content_hash", "image_tag", "pack", "unpack"]

TAG_PREFIX = "coding-agent-env-task"
_MAX_MEMBERS = 20_000


class ContextError(ValueError):
    """A build context archive that is refused: the message says why."""


def content_hash(root: Path) -> str:
    """SHA-256 over every regular file under `root`: its relative path, executable bit and bytes."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(b"x" if path.stat().st_mode & 0o111 else b"-")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def image_tag(digest: str) -> str:
    return f"{TAG_PREFIX}:{digest[:32]}"


def pack(root: Path) -> bytes:
    """`root`'s regular files and directories as a gzipped tar, the same bytes for the same content."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as archive:
        for path in sorted(root.rglob("*")):
            if path.is_symlink() or not (path.is_file() or path.is_dir()):
                continue
            info = tarfile.TarInfo(path.relative_to(root).as_posix())
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if path.is_dir():
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                archive.addfile(info)
                continue
            data = path.read_bytes()
            info.size, info.mode = len(data), 0o755 if path.stat().st_mode & 0o111 else 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def unpack(data: bytes, dest: Path, max_bytes: int) -> None:
    """Extract a context archive (tar, gzipped or not) into the empty directory `dest`; `ContextError` for an
    archive that is malformed, leaves `dest`, holds links or special files, or unpacks to more than `max_bytes`."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as archive:
            members = archive.getmembers()
            if len(members) > _MAX_MEMBERS:
                raise ContextError(f"more than {_MAX_MEMBERS} entries")
            total = 0
            for member in members:
                if not (member.isfile() or member.isdir()):
                    raise ContextError(f"{member.name!r} is not a regular file or directory")
                total += member.size
                if total > max_bytes:
                    raise ContextError(f"unpacks to more than {max_bytes} bytes")
            archive.extractall(dest, filter="data")
    except tarfile.FilterError as exc:
        raise ContextError(f"refused entry: {exc}") from None
    except (tarfile.TarError, EOFError) as exc:
        raise ContextError(f"not a readable tar archive: {exc}") from None
    except OSError as exc:
        raise ContextError(f"cannot unpack it: {exc.strerror or exc}") from None
