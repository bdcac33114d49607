"""Reading a task directory without leaving it (INTEGRITY rule 32).

A `TaskDir` resolves its directory once (`realpath`) and reads only what is really inside it: a file or
directory, a root such as `environment/` included, whose real path leaves the directory is refused with
`OutsideTaskError` naming the path as the task spells it, before anything of it is read. Files are opened
non-blocking and without following a last-moment link, and must be regular files under a size cap, so a FIFO or
a device in a task directory is refused (`TaskFileError`) instead of hanging the loader. Trees are walked
iteratively and never through links: a link whose target stays inside is skipped (as the loaders always did), one
whose target leaves is refused.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = ["OutsideTaskError", "TaskDir", "TaskFileError", "open_regular", "read_regular", "walk_files"]

_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC


class TaskFileError(ValueError):
    """A task file that cannot be read: missing, not a regular file, too big, not UTF-8. The message names it."""


class OutsideTaskError(TaskFileError):
    """A path of a task whose real path leaves the task directory: refused before anything of it is read."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what} leaves the task directory (a link to outside it): refused, nothing of it is read")
        self.what = what


def open_regular(path: Path, what: str) -> BinaryIO:
    """The regular file at `path` (its last component not a link), open for reading; `TaskFileError` otherwise.

    Opened with O_NONBLOCK so a FIFO or device never blocks (it is then refused by `fstat`), and O_NOFOLLOW so a
    link swapped in after the caller checked the path is not followed."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        raise TaskFileError(f"{what} is missing") from None
    except OSError as exc:
        raise TaskFileError(f"cannot read {what}: {exc.strerror or exc}") from None
    handle = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        handle.close()
        raise TaskFileError(f"{what} is not a regular file")
    return handle


def read_regular(path: Path, what: str, max_bytes: int) -> bytes:
    """The bytes of the regular file at `path` (see `open_regular`), refused when over `max_bytes`."""
    with open_regular(path, what) as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise TaskFileError(f"{what} is over {max_bytes} bytes")
    return data


def walk_files(root: Path) -> Iterator[tuple[str, Path, os.stat_result | None]]:
    """Every entry under the directory `root`, depth first in name order (a directory before what it holds, as
    `sorted(root.rglob("*"))` orders them), iteratively and without following links: `(relative posix path, path,
    lstat)` for regular files and directories, `(rel, path, None)` for a link. Other kinds (FIFOs, devices,
    sockets) are left out."""
    pending = _children(root, "")
    while pending:
        rel, entry = pending.pop()
        if entry.is_symlink():
            yield rel, Path(entry.path), None
        elif entry.is_dir(follow_symlinks=False):
            yield rel, Path(entry.path), entry.stat(follow_symlinks=False)
            pending.extend(_children(Path(entry.path), rel))
        elif entry.is_file(follow_symlinks=False):
            yield rel, Path(entry.path), entry.stat(follow_symlinks=False)


def _children(directory: Path, prefix: str) -> list[tuple[str, os.DirEntry[str]]]:
    """`directory`'s entries by relative path, in reverse name order (the walk pops from the end)."""
    with os.scandir(directory) as entries:
        found = sorted(entries, key=lambda entry: entry.name, reverse=True)
    return [(f"{prefix}/{entry.name}" if prefix else entry.name, entry) for entry in found]


class TaskDir:
    """A task directory, resolved once; every path is checked against it before it is read.

    `name` is the directory as given (for messages); `root` its real path. Paths are task-relative posix
    strings (`"tests"`, `"solution/solve.sh"`)."""

    def __init__(self, path: Path, max_file_bytes: int) -> None:
        self.name = str(path)
        self.root = Path(os.path.realpath(path))
        self.max_file_bytes = max_file_bytes

    def locate(self, rel: str) -> Path:
        """The real path of `rel`, inside the task directory (which it need not exist in); `OutsideTaskError`
        when it leaves it."""
        real = Path(os.path.realpath(self.root / rel))
        if not real.is_relative_to(self.root):
            raise OutsideTaskError(rel)
        return real

    def is_file(self, rel: str) -> bool:
        """Whether `rel` is a regular file (after the links inside the directory); refused when it leaves."""
        return self.locate(rel).is_file()

    def is_dir(self, rel: str) -> bool:
        return self.locate(rel).is_dir()

    def read_text(self, rel: str) -> str:
        """The UTF-8 text of the regular file `rel`."""
        data = read_regular(self.locate(rel), rel, self.max_file_bytes)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise TaskFileError(f"{rel} is not UTF-8 text") from None

    def check_tree(self, rel: str) -> None:
        """Refuse the directory `rel` if it, or any link below it, leaves the task directory."""
        for _ in self._files(rel):
            pass

    def text_tree(self, rel: str) -> dict[str, str]:
        """Every regular file under the directory `rel` as text, by path relative to it (links inside the
        task directory are skipped, links leaving it refused), at most `max_file_bytes` in all."""
        base = rel.rstrip("/")
        files: dict[str, str] = {}
        total = 0
        for sub in self._files(base):
            files[sub] = self.read_text(f"{base}/{sub}")
            total += len(files[sub])
            if total > self.max_file_bytes:  # a request could not carry them: stop reading now
                raise TaskFileError(f"{base}/ holds more than {self.max_file_bytes} bytes of files")
        return files

    def _files(self, rel: str) -> Iterator[str]:
        """The regular files under the directory `rel`, by path relative to it."""
        real = self.locate(rel)
        if not real.is_dir():
            raise TaskFileError(f"{rel}/ is missing")
        for sub, path, info in walk_files(real):
            if info is None:
                # A link is never followed here; one whose target leaves is refused all the same, so a task
                # that depends on outside files says so instead of silently losing them.
                target = Path(os.path.realpath(path))
                if not target.is_relative_to(self.root):
                    raise OutsideTaskError(f"{rel}/{sub}")
            elif stat.S_ISREG(info.st_mode):
                yield sub
