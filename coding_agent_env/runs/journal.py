"""The batch's JSONL journal: one line per finished rollout, appended and flushed as it finishes, so an
interrupted run loses nothing and a rerun with the same file skips what is done.

A line is `{"task_id", "attempt", "source", "notes", "result"}` (`result`: the `RolloutResult`, which holds no
secret). A rollout counts as done once its line is whole; a torn last line (a crash mid-write) is ignored and
cut off before appending, so the file stays valid JSONL.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from coding_agent_env.models import RolloutResult
from coding_agent_env.runs.store_text import escaped

__all__ = ["Journal", "Record", "append_record", "read_records"]


@dataclass(frozen=True)
class Record:
    """One finished rollout of a batch."""

    task_id: str
    attempt: int
    result: RolloutResult
    source: str = ""
    notes: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[str, int]:
        return self.task_id, self.attempt

    def to_json(self) -> str:
        """One line of valid UTF-8 JSON whatever the record holds: NUL is `\\u0000` (as `json` writes it), and a
        lone surrogate (which no UTF-8 file can hold) its `\\udXXX` escape, so `from_json` gives it back."""
        data = {"task_id": self.task_id, "attempt": self.attempt, "source": self.source, "notes": list(self.notes),
                "result": self.result.model_dump(mode="json")}
        # Raw (unescaped) lone surrogates only appear inside JSON strings, where their escape is valid JSON.
        return escaped(json.dumps(data, ensure_ascii=False, separators=(",", ":")))

    @classmethod
    def from_json(cls, line: str) -> Record:
        data: dict[str, Any] = json.loads(line)
        return cls(str(data["task_id"]), int(data["attempt"]), RolloutResult.model_validate(data["result"]),
                   str(data.get("source", "")), tuple(data.get("notes", ())))


def read_records(path: Path) -> Iterator[Record]:
    """The whole records of a journal, one line at a time (a torn or foreign line is skipped)."""
    if not path.exists():
        return
    with path.open(encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if not line.endswith("\n"):
                return  # torn by a crash mid-write
            try:
                yield Record.from_json(line)
            except (ValueError, KeyError, TypeError):
                continue


class Journal:
    """Appends records to `path`; `done` holds the (task_id, attempt) pairs already there."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.done: set[tuple[str, int]] = {record.key for record in read_records(path)}
        self._handle: IO[str] | None = None

    def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _cut_torn_tail(self.path)
        self._handle = self.path.open("a", encoding="utf-8")

    def append(self, record: Record) -> None:
        assert self._handle is not None, "Journal.open() first"
        self._handle.write(record.to_json() + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())  # Ctrl-C or a crash right after still leaves the line whole
        self.done.add(record.key)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def append_record(path: Path, record: Record) -> None:
    """Append one record to the journal at `path` (made if missing; a torn last line cut first), on disk when it
    returns; OSError when it cannot be. Under an exclusive `flock` of the file, cut and append together: servers
    sharing a STATE_DIR append to one file, and one's cut must never take another's line while it is written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)  # released as the file closes
        _cut_torn_tail(path)
        handle.write(record.to_json() + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def _cut_torn_tail(path: Path) -> None:
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open("rb+") as handle:
        handle.seek(-1, os.SEEK_END)
        if handle.read(1) == b"\n":
            return
        data_end = handle.seek(0, os.SEEK_END)
        # Walk back to the last newline: bounded by the length of one line.
        position = data_end
        while position > 0:
            step = min(65536, position)
            handle.seek(position - step)
            chunk = handle.read(step)
            index = chunk.rfind(b"\n")
            if index >= 0:
                handle.truncate(position - step + index + 1)
                return
            position -= step
        handle.truncate(0)
