"""The results store: every finished rollout of a batch (and, by setting, of the server) in one database: a
SQLite file by default, or a PostgreSQL database that several server replicas share (`RESULTS_DB`).

One row per rollout: the columns filters need (run, task, attempt, agent, sandbox, status, reward, when) and the
whole `RolloutResult` as JSON (it holds no secret). Runs are rows of their own (when, what command, origin).
Writers and readers may be different processes (servers, `run`, `runs`); each backend says how they share
(`store_sqlite`: WAL and a busy timeout; `store_postgres`: autocommit and an advisory lock). Retention
(`prune`) keeps the newest N rollouts and drops those older than an age; it runs when a writer opens a run and
every `PRUNE_EVERY` writes, one writer at a time.

This class is dialect-neutral: its SQL is written once, with `?` placeholders and the backend's `Dialect` for
the few fragments that differ. Thread-safety: one connection guarded by a lock; calls are short, so the server
calls them from a worker thread.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from coding_agent_env.models import RolloutResult
from coding_agent_env.runs.journal import Record
from coding_agent_env.runs.store_backend import Backend, Dialect
from coding_agent_env.runs.store_errors import ResultsStoreError
from coding_agent_env.runs.store_location import Location, PostgresLocation, parse_location
from coding_agent_env.runs.store_sqlite import DIALECT as SQLITE
from coding_agent_env.runs.store_text import dump_result, escaped, exact_json, load_result, restored
from coding_agent_env.settings import Settings

__all__ = ["Filters", "Location", "ResultsStore", "ResultsStoreError", "RolloutRow", "RunRow", "default_path"]

log = logging.getLogger(__name__)

PRUNE_EVERY = 1000
_COLUMNS = ("rollout_id, run_id, task_id, attempt, agent, sandbox, status, reward, finished, wall_s, source, notes, "
            "exact")
_TEXT_COLUMNS = ("rollout_id", "run_id", "task_id", "agent", "sandbox", "status", "source")
"""The columns holding caller- or sandbox-given text (`store_text`: stored escaped, exact in `exact`)."""
_UPSERT = (f"INSERT INTO rollouts ({_COLUMNS}, result) VALUES ({', '.join('?' * 14)}) ON CONFLICT (rollout_id) "
           "DO UPDATE SET " + ", ".join(f"{column} = excluded.{column}" for column in
                                        (*_COLUMNS.split(", ")[1:], "result")))
_EXPORT_PAGE = 500


def open_backend(location: Location) -> Backend:
    """Connect to the store at `location`: a SQLite file, or a PostgreSQL database (its module, and the driver,
    imported only then)."""
    if isinstance(location, Path):
        from coding_agent_env.runs.store_sqlite import SqliteBackend

        return SqliteBackend(location)
    from coding_agent_env.runs.store_postgres import PostgresBackend

    return PostgresBackend(location)


def default_path(settings: Settings) -> Location:
    """The store settings name: `RESULTS_DB` (a path, or a PostgreSQL database), else `STATE_DIR/results.sqlite`."""
    configured = settings.results_db
    if configured is None:
        return settings.state_dir / "results.sqlite"
    if isinstance(configured, Path):
        return configured
    return PostgresLocation(configured.get_secret_value())


@dataclass(frozen=True)
class Filters:
    """Which rollouts to list; None (or empty) matches all. `task` is a substring of the task id."""

    run_id: str | None = None
    task: str | None = None
    agent: str | None = None
    status: str | None = None
    min_reward: float | None = None
    max_reward: float | None = None

    def where(self, dialect: Dialect = SQLITE) -> tuple[str, list[Any]]:
        """The WHERE clause (with `?` placeholders, or "") and its values."""
        clauses: list[str] = []
        values: list[Any] = []
        for column, value in (("run_id", self.run_id), ("agent", self.agent), ("status", self.status)):
            if value:
                clauses.append(f"{column} = ?")
                values.append(escaped(value))  # as the column holds it (`store_text`)
        if self.task:
            clauses.append(dialect.contains.format(column="task_id"))
            values.append(escaped(self.task))
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


def _rollout_row(row: tuple[Any, ...]) -> RolloutRow:
    """A row of `_COLUMNS`, its text as it was given (`store_text`)."""
    exact = row[12]
    values = [restored(column, value, exact) if column in _TEXT_COLUMNS else value
              for column, value in zip(_COLUMNS.split(", ")[:11], row[:11], strict=True)]
    return RolloutRow(*values, json.loads(row[11]))


class ResultsStore:
    """A results store, opened: `with ResultsStore(location) as store: ...`. `location` is a SQLite file's path
    or a PostgreSQL URL / `PostgresLocation` (`store_location.parse_location`); `path` is it, parsed (printable:
    a URL's password is redacted). Opening makes the schema if missing; `ResultsStoreError` (redacted) when the
    store cannot be reached, `StoreMissingExtraError` when PostgreSQL's driver is not installed."""

    def __init__(self, location: Location | str, *, max_rollouts: int = 0, max_age_days: float = 0.0) -> None:
        self.path: Location = parse_location(location)
        self.max_rollouts = max_rollouts
        self.max_age_days = max_age_days
        self._lock = threading.Lock()
        self._writes = 0
        self._db = open_backend(self.path)
        self._dialect = self._db.dialect

    @classmethod
    def from_settings(cls, settings: Settings, path: Location | None = None) -> ResultsStore:
        """The store `path` names (default: the settings'), with the settings' retention."""
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
            self._db.execute("INSERT INTO runs (run_id, started, origin, description) VALUES (?, ?, ?, ?)",
                             (run_id, time.time(), escaped(origin), escaped(description)))
        self._retain()
        return run_id

    def add(self, run_id: str, record: Record) -> None:
        """Store one finished rollout (an upsert by rollout id); returns once the database has acknowledged it.
        Any text is storable (`store_text`); `ResultsStoreError` when the database refuses the row or cannot be
        reached: the row is then not stored, and the caller must say so (nothing is retried here)."""
        result = record.result
        text = dict(zip(_TEXT_COLUMNS, (result.rollout_id, run_id, record.task_id, result.agent, result.sandbox,
                                        result.status.value, record.source), strict=True))
        stored = {column: escaped(value) for column, value in text.items()}
        row = (stored["rollout_id"], stored["run_id"], stored["task_id"], record.attempt, stored["agent"],
               stored["sandbox"], stored["status"], result.reward, time.time(), result.wall_s, stored["source"],
               json.dumps(list(record.notes)), exact_json(text), dump_result(result))
        with self._lock:
            self._db.execute(_UPSERT, row)
            self._writes += 1
            due = self._writes % PRUNE_EVERY == 0
        if due:
            self._retain()

    def _retain(self) -> None:
        """`prune`, after a write the database acknowledged: a retention pass that fails is not that write's
        failure (the row or run is stored), only logged."""
        try:
            self.prune()
        except ResultsStoreError as exc:
            log.warning("results store: retention not applied this time: %s", exc)

    def prune(self, now: float | None = None) -> int:
        """Apply retention as of `now` (default: the present); the number of rollouts removed. Runs left empty
        by it go too; a run started after every rollout removed stays (another writer may just have opened it
        and not written yet). Pruners take turns (`Backend.exclusive`): two never delete crosswise."""
        if self.max_age_days <= 0 and self.max_rollouts <= 0:
            return 0
        rowid = self._dialect.rowid
        finished: list[float] = []
        with self._lock, self._db.exclusive():
            if self.max_age_days > 0:
                cutoff = (time.time() if now is None else now) - self.max_age_days * 86400
                finished += [row[0] for row in self._db.query(
                    "DELETE FROM rollouts WHERE finished < ? RETURNING finished", (cutoff,))]
            if self.max_rollouts > 0:
                finished += [row[0] for row in self._db.query(
                    f"DELETE FROM rollouts WHERE {rowid} NOT IN (SELECT {rowid} FROM rollouts ORDER BY finished DESC "
                    "LIMIT ?) RETURNING finished", (self.max_rollouts,))]
            if finished:
                self._db.execute("DELETE FROM runs WHERE started <= ? AND run_id NOT IN "
                                 "(SELECT DISTINCT run_id FROM rollouts)", (max(finished),))
        return len(finished)

    # -- reading -------------------------------------------------------------------------------------------

    def runs(self, limit: int = 100) -> list[RunRow]:
        query = ("SELECT runs.run_id, started, origin, description, count(rollouts.rollout_id), avg(reward) FROM runs "
                 "LEFT JOIN rollouts ON rollouts.run_id = runs.run_id GROUP BY runs.run_id ORDER BY started DESC "
                 "LIMIT ?")
        with self._lock:
            return [RunRow(*row) for row in self._db.query(query, (limit,))]

    def rollouts(self, filters: Filters | None = None, limit: int = 200, offset: int = 0) -> list[RolloutRow]:
        where, values = (filters or Filters()).where(self._dialect)
        query = f"SELECT {_COLUMNS} FROM rollouts{where} ORDER BY finished DESC LIMIT ? OFFSET ?"
        with self._lock:
            rows = self._db.query(query, (*values, limit, offset))
        return [_rollout_row(row) for row in rows]

    def measures(self, filters: Filters | None = None, limit: int = 2000) -> list[tuple[RolloutRow, dict[str, Any]]]:
        """The newest `limit` rollouts matching, each with its result's `timings` and `limits_hit` (read from the
        stored JSON by the database, not parsed whole here): what the Runs view's charts plot."""
        where, values = (filters or Filters()).where(self._dialect)
        field = self._dialect.json_field
        timings, limits_hit = (field.format(column="result", key=key) for key in ("timings", "limits_hit"))
        query = f"SELECT {_COLUMNS}, {timings}, {limits_hit} FROM rollouts{where} ORDER BY finished DESC LIMIT ?"
        with self._lock:
            rows = self._db.query(query, (*values, limit))
        return [(_rollout_row(row), {"timings": json.loads(row[13] or "{}"), "limits_hit": json.loads(row[14] or "[]")})
                for row in rows]

    def task_outcomes(self, filters: Filters | None = None) -> list[tuple[str, int, int, int, float]]:
        """Per task: (task id, rollouts, scored rollouts, passes (reward 1), seconds of the scored ones), most
        rollouts first: what a task sampler learns from (`tasks.sampler`, `coding-agent-env tasks stats`)."""
        where, values = (filters or Filters()).where(self._dialect)
        # Grouped by the stored (escaped) id; the exact id comes from any row's `exact` (`store_text`).
        query = (f"SELECT task_id, COUNT(*), COUNT(reward), SUM(CASE WHEN reward >= 1.0 THEN 1 ELSE 0 END), "
                 f"SUM(CASE WHEN reward IS NOT NULL THEN wall_s ELSE 0 END), MAX(exact) FROM rollouts{where} "
                 "GROUP BY task_id ORDER BY COUNT(*) DESC, task_id")
        with self._lock:
            rows = self._db.query(query, values)
        return [(restored("task_id", task, exact), total, scored, int(passes or 0), float(seconds or 0.0))
                for task, total, scored, passes, seconds, exact in rows]

    def result(self, rollout_id: str) -> RolloutResult | None:
        with self._lock:
            rows = self._db.query("SELECT result FROM rollouts WHERE rollout_id = ?", (escaped(rollout_id),))
        return load_result(rows[0][0]) if rows else None

    def export(self, out: TextIO, filters: Filters | None = None) -> int:
        """Write the matching rollouts as JSONL (the batch journal's line shape plus `run_id`), oldest first,
        a page at a time; the number written."""
        count = 0
        for line in self._export_lines(filters or Filters()):
            out.write(line + "\n")
            count += 1
        return count

    def _export_lines(self, filters: Filters) -> Iterator[str]:
        where, values = filters.where(self._dialect)
        rowid = self._dialect.rowid
        last = -1
        while True:
            clause = f"{where} AND {rowid} > ?" if where else f" WHERE {rowid} > ?"
            query = (f"SELECT {rowid}, run_id, task_id, attempt, source, notes, result, exact FROM rollouts{clause} "
                     f"ORDER BY {rowid} LIMIT {_EXPORT_PAGE}")
            with self._lock:
                rows = self._db.query(query, (*values, last))
            if not rows:
                return
            for key, run_id, task_id, attempt, source, notes, result, exact in rows:
                last = key
                run_id, task_id, source = (restored(column, value, exact) for column, value in
                                           (("run_id", run_id), ("task_id", task_id), ("source", source)))
                yield (f'{{"run_id":{json.dumps(run_id)},"task_id":{json.dumps(task_id)},"attempt":{attempt},'
                       f'"source":{json.dumps(source)},"notes":{notes},"result":{result}}}')
