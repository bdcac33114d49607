"""Fixtures: a real server of ours per test (uvicorn in a thread, the local backend with bubblewrap)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from coding_agent_env.settings import Settings
from tests.protocol.live import LiveServer


@pytest.fixture
def make_live(settings: Settings) -> Iterator[Callable[..., LiveServer]]:
    started: list[LiveServer] = []

    def make(**overrides: Any) -> LiveServer:
        server = LiveServer(Settings(state_dir=settings.state_dir, backends=settings.backends, **overrides)).start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


@pytest.fixture
def live(make_live: Callable[..., LiveServer]) -> LiveServer:
    return make_live()
