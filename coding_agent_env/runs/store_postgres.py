"""The results store in a PostgreSQL database, shared by every server replica and batch pointed at one URL.

The driver (`psycopg` 3, the `postgres` extra) is imported here, and this module only when such a store is
opened. Every driver error is translated here into the store's own errors, with the URL's password removed.
Writers coordinate through the database: each statement is its own transaction (autocommit; inserts are
upserts by rollout id, so a retried write is harmless), and schema creation and retention run under one
transaction-scoped advisory lock, so two writers never race `CREATE TABLE` nor delete the same rows in
different orders (which could deadlock).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from coding_agent_env.runs.store_backend import Backend, Dialect, statements
from coding_agent_env.runs.store_errors import (
    MAX_DB_MESSAGE_CHARS,
    ResultsStoreError,
    StoreLocationError,
    StoreMissingExtraError,
    StoreUnavailableError,
)
from coding_agent_env.runs.store_location import PostgresLocation

__all__ = ["SCHEMA", "PostgresBackend"]

CONNECT_TIMEOUT_S = 10
"""How long opening the store waits for the server, unless the URL says (`connect_timeout=`)."""
_LOCK_KEY = 0x636165_7273  # "cae" "rs": the advisory lock of this schema's exclusive sections
_APPLICATION = "coding-agent-env results store"
SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, started DOUBLE PRECISION NOT NULL, origin TEXT NOT NULL,
    description TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS rollouts (
    seq BIGINT GENERATED ALWAYS AS IDENTITY,
    rollout_id TEXT PRIMARY KEY, run_id TEXT NOT NULL, task_id TEXT NOT NULL, attempt INTEGER NOT NULL,
    agent TEXT NOT NULL, sandbox TEXT NOT NULL, status TEXT NOT NULL, reward DOUBLE PRECISION,
    finished DOUBLE PRECISION NOT NULL, wall_s DOUBLE PRECISION NOT NULL, source TEXT NOT NULL DEFAULT '',
    notes TEXT NOT NULL DEFAULT '[]', result TEXT NOT NULL, exact TEXT
);
CREATE INDEX IF NOT EXISTS rollouts_seq ON rollouts (seq);
CREATE INDEX IF NOT EXISTS rollouts_finished ON rollouts (finished);
CREATE INDEX IF NOT EXISTS rollouts_task ON rollouts (task_id);
CREATE INDEX IF NOT EXISTS rollouts_run ON rollouts (run_id)
"""
# `result` stays TEXT (not jsonb): export writes it back byte for byte; the charts' two fields are cast per query.
# A result holding a NUL character (`\u0000` in its JSON: a sandbox's output may) cannot be cast to jsonb; its
# chart fields are then null rather than the query failing for every row.
DIALECT = Dialect(
    rowid="seq", contains="strpos({column}, ?) > 0",
    json_field="(CASE WHEN strpos({column}, '\\u0000') = 0 THEN (({column})::jsonb -> '{key}')::text END)",
)


_HAS_EXACT = ("SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema() "
              "AND table_name = 'rollouts' AND column_name = 'exact'")

STATEMENT_TIMEOUT_MS = 30_000
"""The longest a statement may run (a prune of many rows included); past it, it fails (a store error)."""


def _driver() -> Any:
    try:
        return importlib.import_module("psycopg")
    except ImportError as exc:
        raise StoreMissingExtraError() from exc


class PostgresBackend(Backend):
    """A connection (autocommit) to the database at `location`; the schema is made if missing. A connection
    the server dropped (restart, failover) is replaced, and the statement that found it dead run again."""

    dialect = DIALECT

    def __init__(self, location: PostgresLocation) -> None:
        self.location = location
        self._psycopg = _driver()
        self._exclusive = False
        self._conn = self._connect()
        try:
            with self.exclusive():
                for statement in statements(SCHEMA):
                    self._conn.execute(statement)
                if not self._conn.execute(_HAS_EXACT).fetchall():
                    # A store made before `exact` (`store_text`). Only then: ALTER locks the whole table.
                    self._conn.execute("ALTER TABLE rollouts ADD COLUMN IF NOT EXISTS exact TEXT")
        except BaseException:
            self._conn.close()
            raise

    def _connect(self) -> Any:
        psycopg = self._psycopg
        try:
            params = psycopg.conninfo.conninfo_to_dict(self.location.url)
        except psycopg.Error as exc:
            raise StoreLocationError(f"results store {self.location}: not a valid PostgreSQL URL: "
                                     f"{self._redacted(exc)}") from None
        params.setdefault("connect_timeout", CONNECT_TIMEOUT_S)
        params.setdefault("application_name", _APPLICATION)
        # Every statement has a deadline, and a connection a failover left half-open is found dead in seconds,
        # not after the kernel's retransmissions (minutes): the writer thread and shutdown never hang on it.
        params.setdefault("options", f"-c statement_timeout={STATEMENT_TIMEOUT_MS}")
        params.setdefault("keepalives", 1)
        params.setdefault("keepalives_idle", 10)
        params.setdefault("keepalives_interval", 5)
        params.setdefault("keepalives_count", 3)
        params.setdefault("tcp_user_timeout", STATEMENT_TIMEOUT_MS)
        try:
            return psycopg.connect(autocommit=True, **params)
        except psycopg.Error as exc:
            # `from None`: the driver's exception may carry the conninfo; ours says all, redacted.
            raise StoreUnavailableError(f"results store {self.location}: cannot connect: "
                                        f"{self._redacted(exc)}") from None

    def _redacted(self, exc: BaseException) -> str:
        text = " ".join(str(exc).split())
        for secret in self.location.secrets():
            text = text.replace(secret, "***")
        return text

    def _live(self) -> Any:
        if self._conn.closed or self._conn.broken:
            self._conn = self._connect()
        return self._conn

    @contextmanager
    def _translated(self) -> Iterator[None]:
        psycopg = self._psycopg
        try:
            yield
        except ResultsStoreError:
            raise  # already ours (a reconnect that failed)
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            raise StoreUnavailableError(f"results store {self.location}: {self._redacted(exc)}") from None
        except psycopg.Error as exc:
            raise ResultsStoreError(f"results store {self.location}: {self._redacted(exc)}") from None
        except (ValueError, OverflowError) as exc:  # a value the driver could not encode (`store_text` escapes them)
            raise ResultsStoreError(f"results store {self.location}: {type(exc).__name__}: "
                                    f"{self._redacted(exc)[:MAX_DB_MESSAGE_CHARS]}") from None

    @staticmethod
    def _sql(sql: str) -> str:
        # The store writes `?` placeholders (and no `%`): psycopg's are `%s`.
        return sql.replace("?", "%s")

    def _statement(self, sql: str, params: Sequence[Any]) -> Any:
        """Run one statement; a connection found dead by it (server restarted, connection killed) is replaced
        and the statement run once more, unless it was part of an `exclusive` transaction (which is then
        rolled back as a whole). Every statement the store sends outside one is safe to repeat: upserts,
        deletes, reads, and inserts of fresh run ids."""
        with self._translated():
            conn = self._live()
            try:
                return conn.execute(self._sql(sql), tuple(params))
            except self._psycopg.OperationalError:
                if self._exclusive or not conn.broken:
                    raise
            return self._live().execute(self._sql(sql), tuple(params))

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        return self._statement(sql, params).rowcount

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._translated():
            return self._statement(sql, params).fetchall()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._translated():
            conn = self._live()
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
                self._exclusive = True
                try:
                    yield
                finally:
                    self._exclusive = False

    def close(self) -> None:
        self._conn.close()
