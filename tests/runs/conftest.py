"""Fixtures for the results store: a real PostgreSQL server for the session (skipped where PostgreSQL is not
installed, a failure under CI), one fresh database per test, and `store_location`, which runs a test against
both kinds of store."""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pg import PostgresServer, postgres_bin


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    bin_dir = postgres_bin()
    missing = "PostgreSQL is not installed (apt-get install postgresql)" if bin_dir is None else ""
    if bin_dir is not None and os.geteuid() == 0 and not _user_exists("postgres"):
        missing = "running as root, PostgreSQL needs the `postgres` user (Debian's package makes it)"
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{missing}: the shared results store is untested")
        pytest.skip(missing)
    assert bin_dir is not None
    with PostgresServer(bin_dir) as server:
        yield server


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A libpq URL (with its password) to an empty database of this test's own, dropped after it."""
    url = postgres_server.create_database()
    try:
        yield url
    finally:
        postgres_server.drop_database(url)


@pytest.fixture(params=["sqlite", "postgres"])
def store_location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a test's results store lives, once per kind: a SQLite file, then a PostgreSQL database (URL)."""
    if request.param == "sqlite":
        return str(tmp_path / "r.sqlite")
    return request.getfixturevalue("postgres_url")
