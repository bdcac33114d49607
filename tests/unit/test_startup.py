"""Enabled backends are checked (and their orphans reaped) at startup, not at the first rollout."""

from __future__ import annotations

import os

from coding_agent_env.api.startup import check_backends
from coding_agent_env.sandbox import Backends
from coding_agent_env.settings import DockerConfig, Settings


async def test_startup_reports_and_reaps(settings: Settings) -> None:
    orphan = settings.state_dir / "999999999-deadrollout-00000000"
    (orphan / "work").mkdir(parents=True)
    async with Backends(settings) as backends:
        report = await check_backends(backends)
    assert report["local"].startswith("ok (") and not orphan.exists()


async def test_an_absent_engine_is_reported_not_raised(settings: Settings) -> None:
    missing = settings.with_backends(*settings.backends, DockerConfig(host="unix:///nonexistent/docker.sock"))
    async with Backends(missing) as backends:
        report = await check_backends(backends)
    assert report["local"].startswith("ok (") and report["docker"].startswith("unavailable:"), report
    assert os.path.exists(settings.state_dir)
