"""Fixtures: live servers started per test and stopped after it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from coding_agent_env.settings import Settings
from tests.protocol.live import ORACLE_TASK, LiveServer


@pytest.fixture
def make_server() -> Iterator[Callable[..., LiveServer]]:
    started: list[LiveServer] = []

    def make(**overrides: Any) -> LiveServer:
        settings = Settings(**overrides)
        server = LiveServer(settings).start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


@pytest.fixture
def server(make_server: Callable[..., LiveServer]) -> LiveServer:
    return make_server()


@pytest.fixture
def http(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.http, timeout=60) as client:
        yield client


@pytest.fixture
def oracle_task() -> dict[str, Any]:
    return dict(ORACLE_TASK)
