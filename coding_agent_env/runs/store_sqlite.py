"""The results store in one SQLite file: WAL mode, short transactions and a busy timeout, so several processes
(the server, `run`, `runs`) read and write it at once."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from coding_agent_env.runs.store_backend import Backend, Dialect, statements
from coding_agent_env.runs.store_errors import MAX_DB_MESSAGE_CHARS, ResultsStoreError, StoreUnavailableError

__all__ = ["SCHEMA", "SqliteBackend"]

_BUSY_TIMEOUT_S = 30.0
SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, started REAL NOT NULL, origin TEXT NOT NULL, description TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS rollouts (
    rollout_id TEXT PRIMARY KEY, run_id TEXT NOT NULL, task_id TEXT NOT NULL, attempt INTEGER NOT NULL,
    agent TEXT NOT NULL, sandbox TEXT NOT NULL, status TEXT NOT NULL, reward REAL, finished REAL NOT NULL,
    wall_s REAL NOT NULL, source TEXT NOT NULL DEFAULT '', notes TEXT NOT NULL DEFAULT '[]', result TEXT NOT NULL,
    exact TEXT
);
CREATE INDEX IF NOT EXISTS rollouts_finished ON rollouts (finished);
CREATE INDEX IF NOT EXISTS rollouts_task ON rollouts (task_id);
CREATE INDEX IF NOT EXISTS rollouts_run ON rollouts (run_id)
"""
DIALECT = Dialect(rowid="rowid", contains="instr({column}, ?) > 0", json_field="json_extract({column}, '$.{key}')")


class SqliteBackend(Backend):
    """A connection in autocommit mode (each statement its own transaction) to the file at `path`, made with
    its directory if missing."""

    dialect = DIALECT

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, timeout=_BUSY_TIMEOUT_S, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")  # WAL: durable at checkpoints, never corrupt
            for statement in statements(SCHEMA):
                self._db.execute(statement)
            self._add_exact_column()
        except (OSError, sqlite3.Error) as exc:
            raise StoreUnavailableError(f"results store {path}: {exc}") from exc

    def _add_exact_column(self) -> None:
        """A store made before `exact` existed (`store_text`) gets it; rows already there read as they are.
        Asked first without a lock (a store that has it, or is read-only, is left alone), then again under the
        write lock (two writers opening an old store at once)."""
        if self._has_exact():
            return
        with self.exclusive():
            if not self._has_exact():
                self._db.execute("ALTER TABLE rollouts ADD COLUMN exact TEXT")

    def _has_exact(self) -> bool:
        return any(row[1] == "exact" for row in self._db.execute("PRAGMA table_info(rollouts)"))

    @contextmanager
    def _translated(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.OperationalError as exc:  # locked past the busy timeout, disk full, I/O error
            raise StoreUnavailableError(f"results store {self.path}: {exc}") from None
        except (sqlite3.Error, ValueError, OverflowError) as exc:  # refused (a constraint), or a value not bound
            message = str(exc)[:MAX_DB_MESSAGE_CHARS]
            raise ResultsStoreError(f"results store {self.path}: {type(exc).__name__}: {message}") from None

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        with self._translated():
            return self._db.execute(sql, params).rowcount

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._translated():
            return self._db.execute(sql, params).fetchall()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        # IMMEDIATE takes the file's write lock up front: two pruners queue (busy timeout) instead of one
        # failing on lock upgrade half-way.
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        with self._translated():
            self._db.execute("COMMIT")

    def close(self) -> None:
        self._db.close()
