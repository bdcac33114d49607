"""Errors at the results store's boundary: where it is (the location) and whether it can be reached."""

from __future__ import annotations

from coding_agent_env.errors import CodingAgentEnvError

__all__ = [
    "MAX_DB_MESSAGE_CHARS",
    "ResultsStoreError",
    "StoreLocationError",
    "StoreMissingExtraError",
    "StoreUnavailableError",
]

MAX_DB_MESSAGE_CHARS = 300
"""Characters of a database's own message kept in a `ResultsStoreError` (a refused value can be long)."""


class ResultsStoreError(CodingAgentEnvError):
    """The results store could not be opened, read or written. Messages never carry a password."""


class StoreLocationError(ResultsStoreError, ValueError):
    """`RESULTS_DB` / `--results-db` is neither a file path nor a valid PostgreSQL URL (a ValueError, so a
    settings validator reports it as an invalid value)."""


class StoreUnavailableError(ResultsStoreError):
    """The store's database cannot be reached or refused us (server down, wrong password, no such database)."""


class StoreMissingExtraError(StoreUnavailableError):
    """A PostgreSQL store was asked for but its driver (`psycopg`, the `postgres` extra) is not installed."""

    def __init__(self) -> None:
        super().__init__("a PostgreSQL results store needs: pip install 'coding-agent-env[postgres]'")
        self.extra = "postgres"
