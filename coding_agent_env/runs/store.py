"""The results store: every finished rollout of a batch (and, by setting, of the server) in one SQLite file.

One row per rollout: the columns filters need (run, task, attempt, agent, sandbox, status, reward, when) and the
whole `RolloutResult` as JSON (it holds no secret). Runs are rows of their own (when, what command, origin).
Writers and readers may be different processes (the server, `run`, `runs`): WAL mode, short transactions, a
busy timeout. Retention (`prune`) keeps the newest N rollouts and drops those older than an age; it runs when a
writer opens the store and every `PRUNE_EVERY` writes.

Thread-safety: one connection guarded by a lock; calls are short, so the server calls them from a worker thread.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from coding_agent_env.models import RolloutResult
from coding_agent_env.runs.journal import Record
from coding_agent_env.settings import Settings

__all__ = ["Filters", "ResultsStore", "RolloutRow", "RunRow", "default_path"]

PRUNE_EVERY = 1000
_BUSY_TIMEOUT_S = 30.0
_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, started REAL NOT NULL, origin TEXT NOT NULL, description TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS rollouts (
    rollout_id TEXT PRIMARY KEY, run_id TEXT NOT NULL, task_id TEXT NOT NULL, attempt INTEGER NOT NULL,
    agent TEXT NOT NULL, sandbox TEXT NOT NULL, status TEXT NOT NULL, reward REAL, finished REAL NOT NULL,
    wall_s REAL NOT NULL, source TEXT NOT NULL DEFAULT '', notes TEXT NOT NULL DEFAULT '[]', result TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS rollouts_finished ON rollouts (finished);
CREATE INDEX IF NOT EXISTS rollouts_task ON rollouts (task_id);
CREATE INDEX IF NOT EXISTS rollouts_run ON rollouts (run_id);
"""
_COLUMNS = "rollout_id, run_id, task_id, attempt, agent, sandbox, status, reward, finished, wall_s, source, notes"


def default_path(settings: Settings) -> Path:
    return settings.results_db or settings.state_dir / "results.sqlite"


@dataclass(frozen=True)
class Filters:
    """Which rollouts to list; None (or empty) matches all. `task` is a substring of the task id."""

    run_id: str | None = None
    task: str | None = None
    agent: str | None = None
    status: str | None = None
    min_reward: float | None = None
    max_reward: float | None = None

    def where(self) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        values: list[Any] = []
        for column, value in (("run_id", self.run_id), ("agent", self.agent), ("status", self.status)):
            if value:
                clauses.append(f"{column} = ?")
                values.append(value)
        if self.task:
            clauses.append("instr(task_id, ?) > 0")
            values.append(self.task)
        if self.min_reward is not None:
            clauses.append("reward >= ?")
            values.append(self.min_reward)
        if self.max_reward is not None:
            clauses.append("reward <= ?")
            values.append(self.max_reward)
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", values


@dataclass(frozen=True)
class RolloutRow:
    rollout_id: str
    run_id: str
    task_id: str
    attempt: int
    agent: str
    sandbox: str
    status: str
    reward: float | None
    finished: float
    wall_s: float
    source: str
    notes: list[str]


@dataclass(frozen=True)
class RunRow:
    run_id: str
    started: float
    origin: str
    description: str
    rollouts: int
    mean_reward: float | None


class ResultsStore:
    """A results store file; `with ResultsStore(path) as store: ...`."""

    def __init__(self, path: Path, *, max_rollouts: int = 0, max_age_days: float = 0.0) -> None:
        self.path = path
        self.max_rollouts = max_rollouts
        self.max_age_days = max_age_days
        self._lock = threading.Lock()
        self._writes = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, timeout=_BUSY_TIMEOUT_S, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # WAL: durable at checkpoints, never corrupt
        self._db.executescript(_SCHEMA)

    @classmethod
    def from_settings(cls, settings: Settings, path: Path | None = None) -> ResultsStore:
        return cls(path or default_path(settings), max_rollouts=settings.results_max_rollouts,
                   max_age_days=settings.results_max_age_days)

    def __enter__(self) -> ResultsStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- writing -------------------------------------------------------------------------------------------

    def new_run(self, origin: str, description: str = "") -> str:
        run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        with self._lock:
            self._db.execute("INSERT INTO runs VALUES (?, ?, ?, ?)", (run_id, time.time(), origin, description))
        self.prune()
        return run_id

    def add(self, run_id: str, record: Record) -> None:
        result = record.result
        row = (result.rollout_id, run_id, record.task_id, record.attempt, result.agent, result.sandbox,
               result.status.value, result.reward, time.time(), result.wall_s, record.source,
               json.dumps(list(record.notes)), result.model_dump_json())
        with self._lock:
            self._db.execute(f"INSERT OR REPLACE INTO rollouts ({_COLUMNS}, result) VALUES ({', '.join('?' * 13)})",
                             row)
            self._writes += 1
            due = self._writes % PRUNE_EVERY == 0
        if due:
            self.prune()

    def prune(self, now: float | None = None) -> int:
        """Apply retention as of `now` (default: the present); the number of rollouts removed."""
        removed = 0
        with self._lock:
            if self.max_age_days > 0:
                cutoff = (time.time() if now is None else now) - self.max_age_days * 86400
                removed += self._db.execute("DELETE FROM rollouts WHERE finished < ?", (cutoff,)).rowcount
            if self.max_rollouts > 0:
                removed += self._db.execute(
                    "DELETE FROM rollouts WHERE rowid NOT IN (SELECT rowid FROM rollouts ORDER BY finished DESC "
                    "LIMIT ?)", (self.max_rollouts,)).rowcount
            if removed:
                self._db.execute("DELETE FROM runs WHERE run_id NOT IN (SELECT DISTINCT run_id FROM rollouts)")
        return removed

    # -- reading -------------------------------------------------------------------------------------------

    def runs(self, limit: int = 100) -> list[RunRow]:
        query = ("SELECT runs.run_id, started, origin, description, count(rollouts.rollout_id), avg(reward) FROM runs "
                 "LEFT JOIN rollouts ON rollouts.run_id = runs.run_id GROUP BY runs.run_id ORDER BY started DESC "
                 "LIMIT ?")
        with self._lock:
            return [RunRow(*row) for row in self._db.execute(query, (limit,)).fetchall()]

    def rollouts(self, filters: Filters | None = None, limit: int = 200, offset: int = 0) -> list[RolloutRow]:
        where, values = (filters or Filters()).where()
        query = f"SELECT {_COLUMNS} FROM rollouts{where} ORDER BY finished DESC LIMIT ? OFFSET ?"
        with self._lock:
            rows = self._db.execute(query, (*values, limit, offset)).fetchall()
        return [RolloutRow(*row[:11], json.loads(row[11])) for row in rows]

    def measures(self, filters: Filters | None = None, limit: int = 2000) -> list[tuple[RolloutRow, dict[str, Any]]]:
        """The newest `limit` rollouts matching, each with its result's `timings` and `limits_hit` (read from the
        stored JSON by SQLite, not parsed whole here): what the Runs view's charts plot."""
        where, values = (filters or Filters()).where()
        query = (f"SELECT {_COLUMNS}, json_extract(result, '$.timings'), json_extract(result, '$.limits_hit') "
                 f"FROM rollouts{where} ORDER BY finished DESC LIMIT ?")
        with self._lock:
            rows = self._db.execute(query, (*values, limit)).fetchall()
        return [(RolloutRow(*row[:11], json.loads(row[11])),
                 {"timings": json.loads(row[12] or "{}"), "limits_hit": json.loads(row[13] or "[]")}) for row in rows]

    def task_outcomes(self, filters: Filters | None = None) -> list[tuple[str, int, int, int, float]]:
        """Per task: (task id, rollouts, scored rollouts, passes (reward 1), seconds of the scored ones), most
        rollouts first: what a task sampler learns from (`tasks.sampler`, `coding-agent-env tasks stats`)."""
        where, values = (filters or Filters()).where()
        query = (f"SELECT task_id, COUNT(*), COUNT(reward), SUM(reward >= 1.0), "
                 f"SUM(CASE WHEN reward IS NOT NULL THEN wall_s ELSE 0 END) FROM rollouts{where} "
                 "GROUP BY task_id ORDER BY COUNT(*) DESC, task_id")
        with self._lock:
            rows = self._db.execute(query, values).fetchall()
        return [(task, total, scored, int(passes or 0), float(seconds or 0.0)) for task, total, scored, passes, seconds
                in rows]

    def result(self, rollout_id: str) -> RolloutResult | None:
        with self._lock:
            row = self._db.execute("SELECT result FROM rollouts WHERE rollout_id = ?", (rollout_id,)).fetchone()
        return RolloutResult.model_validate_json(row[0]) if row else None

    def export(self, out: TextIO, filters: Filters | None = None) -> int:
        """Write the matching rollouts as JSONL (the batch journal's line shape plus `run_id`), oldest first,
        a page at a time; the number written."""
        count = 0
        for line in self._export_lines(filters or Filters()):
            out.write(line + "\n")
            count += 1
        return count

    def _export_lines(self, filters: Filters) -> Iterator[str]:
        where, values = filters.where()
        last = -1
        while True:
            clause = f"{where} AND rowid > ?" if where else " WHERE rowid > ?"
            query = (f"SELECT rowid, run_id, task_id, attempt, source, notes, result FROM rollouts{clause} "
                     "ORDER BY rowid LIMIT 500")
            with self._lock:
                rows = self._db.execute(query, (*values, last)).fetchall()
            if not rows:
                return
            for rowid, run_id, task_id, attempt, source, notes, result in rows:
                last = rowid
                yield (f'{{"run_id":{json.dumps(run_id)},"task_id":{json.dumps(task_id)},"attempt":{attempt},'
                       f'"source":{json.dumps(source)},"notes":{notes},"result":{result}}}')
