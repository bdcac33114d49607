"""Shared fixtures: isolated settings per test and a check that nothing a test started is left behind."""

from __future__ import annotations

import os
import secrets
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from coding_agent_env.settings import LocalConfig, Settings
from tests.helpers import leftovers

if TYPE_CHECKING:
    from tests.protocol.live import LiveServer


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """A sandbox state dir of the test's own. Not under pytest's tmp_path: that is 0700, and sandbox
    uids must be able to traverse to their roots."""
    path = Path(tempfile.mkdtemp(prefix="cae-test-"))
    os.chmod(path, 0o711)
    yield path
    # rm, not shutil.rmtree: a tree a hostile sandbox left can be deeper than Python's recursion limit.
    subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=False)


@pytest.fixture
def settings(state_dir: Path) -> Settings:
    # Suites may run side by side on one machine: each test gets its own sandbox uid range.
    local = LocalConfig(uid_base=300_000 + secrets.randbelow(20_000) * 64, uid_count=64)
    return Settings(state_dir=state_dir, backends=(local,))


@pytest.fixture
def assert_no_leftovers(settings: Settings) -> Iterator[None]:
    """Fails the test if any process, mount or sandbox directory of its settings is left behind."""
    yield
    left = leftovers(settings)
    assert not left, f"left behind: {left}"


@pytest.fixture
def make_live(settings: Settings) -> Iterator[Callable[..., LiveServer]]:
    """`make_live(**overrides)`: a started live server (tests.protocol.live) with this test's state dir and sandbox
    backends, `overrides` its other settings; every one stopped after the test."""
    from tests.protocol.live import LiveServer  # the server's modules, only for the tests that start one

    started: list[LiveServer] = []

    def make(**overrides: Any) -> LiveServer:
        server = LiveServer(Settings(state_dir=settings.state_dir, backends=settings.backends, **overrides)).start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()
