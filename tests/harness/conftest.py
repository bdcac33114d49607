"""Fixtures: a real server of ours per test (uvicorn in a thread, the local backend with bubblewrap)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.protocol.live import LiveServer


@pytest.fixture
def live(make_live: Callable[..., LiveServer]) -> LiveServer:
    return make_live()
