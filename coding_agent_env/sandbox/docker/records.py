"""What this host's servers recorded making on the engine: the only containers and images the reaper removes.

A label is just a string: a task's Dockerfile can put `coding-agent-env.owner=HOST/PID` and
`coding-agent-env.template=...` on its image, and a reaper that trusted labels would delete that freshly built
task image (or any container made of it by someone else). So every container and template image a server makes
is recorded in the state dir (`RECORD_DIR/<pid>-<start>/<c|i>-<ref>`: an empty file per object, in a directory
of the server process, named by its pid and its start time so a reused pid is not mistaken for it), and
forgotten as it is removed. A container is recorded *before* it is made, by the random name it is then made with
(`new_name`: nobody else knows it, so nothing else can hold it), so a crash at any instant leaves nothing
unrecorded; an image by its id, as soon as its commit returns. The reaper (`reaper.reap`) removes what the
records of dead servers name, nothing else. The state dir is the server's (0700 where it makes it); nothing a
sandbox runs can write there. (A crash between a commit and its record leaves that one image: an operator's to
remove, the price of never removing anything that is not provably ours.)
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RECORD_DIR", "Made", "Record", "dead_records", "new_name"]

RECORD_DIR = "docker-made"
"""Under the state dir: one directory per server process that made anything on the engine."""
_NAME_PREFIX = "cae-"
_ID = re.compile(r"[0-9a-f]{64}|cae-[0-9a-f]{24}")
"""An engine object's id (a container's, an image's without its `sha256:`) or a container's `new_name`."""
_SERVER = re.compile(r"(\d+)-(\d+)")
_UNKNOWN_START = 0
"""A record directory's start time when /proc could not tell it: alive while its pid is (never reaped early)."""
_KINDS = ("c", "i")
"""Containers, images: the order the reaper removes them in (an image a container uses cannot go)."""


def _start_ticks(pid: int) -> int | None:
    """The start time of process `pid` in clock ticks since boot (from /proc), or None when it is gone."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def new_name() -> str:
    """A fresh container name to record before making the container with it."""
    return f"{_NAME_PREFIX}{secrets.token_hex(12)}"


def _bare(object_id: str) -> str:
    bare = object_id.removeprefix("sha256:")
    if not _ID.fullmatch(bare):
        raise ValueError(f"not an engine object id: {object_id[:80]!r}")
    return bare


class Made:
    """This server process's record under `state_dir` (see the module docstring). `add` and `forget` block (a
    file each): call them where the engine call they follow runs (a worker thread)."""

    def __init__(self, state_dir: Path) -> None:
        self.root = state_dir / RECORD_DIR
        self.dir = self.root / f"{os.getpid()}-{_start_ticks(os.getpid()) or _UNKNOWN_START}"

    def add(self, kind: str, object_id: str) -> None:
        """Record a container (`c`: by the name it is about to be made with, or its id) or an image (`i`: its
        id) of this server. OSError when it cannot be written (then the object must not be made, or is removed
        again: what is not recorded would never be reaped)."""
        assert kind in _KINDS
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.dir.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(self.dir / f"{kind}-{_bare(object_id)}", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        os.close(fd)

    def forget(self, kind: str, object_id: str) -> None:
        """Drop the record of an object removed (or never made); nothing recorded is fine."""
        with contextlib.suppress(OSError, ValueError):
            os.unlink(self.dir / f"{kind}-{_bare(object_id)}")


@dataclass(frozen=True)
class Record:
    """A dead server's record: its directory and what it names, `(kind, id)`, containers first."""

    dir: Path
    objects: tuple[tuple[str, str], ...]

    def drop(self, kind: str, object_id: str) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.dir / f"{kind}-{object_id}")

    def close(self) -> None:
        """Remove the directory once it names nothing more (what could not be removed stays for next time)."""
        with contextlib.suppress(OSError):
            self.dir.rmdir()


def dead_records(state_dir: Path) -> list[Record]:
    """The records under `state_dir` of server processes that are gone (their pid not alive, or alive with
    another start time); an entry that is not a record (another name, a link) is ignored, never followed."""
    records = []
    try:
        servers = list(os.scandir(state_dir / RECORD_DIR))
    except OSError:
        return []
    for server in servers:
        match = _SERVER.fullmatch(server.name)
        if match is None or not server.is_dir(follow_symlinks=False):
            continue
        ticks, start = _start_ticks(int(match.group(1))), int(match.group(2))
        if ticks == start or (start == _UNKNOWN_START and ticks is not None):
            continue  # alive (a start time not known when recorded: its pid alive is taken as it): in use
        objects = []
        with contextlib.suppress(OSError), os.scandir(server.path) as entries:
            for entry in entries:
                kind, _, object_id = entry.name.partition("-")
                if kind in _KINDS and _ID.fullmatch(object_id) and entry.is_file(follow_symlinks=False):
                    objects.append((kind, object_id))
        objects.sort(key=lambda item: _KINDS.index(item[0]))
        records.append(Record(Path(server.path), tuple(objects)))
    return records
