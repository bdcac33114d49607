"""The contract between the results store (`runs.store`, dialect-neutral) and one database: a connection that
runs statements written with `?` placeholders, the few SQL fragments that differ between dialects, and a
section in which one writer alone prunes. One module per database implements it (`store_sqlite`,
`store_postgres`); `runs.store` picks one by location and imports a driver only when its kind of store is used
(`StoreMissingExtraError` names the extra that brings it)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

__all__ = ["Backend", "Dialect", "statements"]


@dataclass(frozen=True)
class Dialect:
    """What the store's queries need spelled per database."""

    rowid: str
    """A column that grows with each row inserted (export pages by it)."""
    contains: str
    """A clause true when `{column}` contains the `?` parameter as a substring."""
    json_field: str
    """The JSON text of the top-level key `{key}` of the JSON text in `{column}` (NULL when absent)."""


class Backend(ABC):
    """One open connection to a results store's database (schema made if missing). Not thread-safe: the store
    serialises calls."""

    dialect: Dialect

    @abstractmethod
    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement in its own transaction; the rows it changed."""

    @abstractmethod
    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one statement (a SELECT, or a write with RETURNING); its rows."""

    @abstractmethod
    def exclusive(self) -> AbstractContextManager[None]:
        """A transaction that no other writer's `exclusive` section overlaps (retention, schema changes): one
        commit at the end, a rollback on error."""

    @abstractmethod
    def close(self) -> None:
        """Close the connection (idempotent)."""


def statements(script: str) -> Iterator[str]:
    """The statements of a schema script (no `;` inside a statement)."""
    return (part.strip() for part in script.split(";") if part.strip())
