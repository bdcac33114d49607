"""`shielded`: teardown work finishes however many times its caller is cancelled, then the cancellation wins."""

from __future__ import annotations

import asyncio

import pytest

from coding_agent_env.aio import shielded
from tests.helpers import poll


async def test_work_finishes_through_repeated_cancellation_which_is_then_raised() -> None:
    release = asyncio.Event()
    steps: list[str] = []

    async def teardown() -> str:
        steps.append("started")
        await release.wait()
        steps.append("finished")
        return "done"

    caller = asyncio.ensure_future(shielded(teardown()))
    await poll(lambda: steps == ["started"])
    for _ in range(2):
        caller.cancel()
        done, _ = await asyncio.wait({caller}, timeout=0.05)  # each cancellation is delivered, and absorbed
        assert not done and steps == ["started"]
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert steps == ["started", "finished"]


async def test_without_cancellation_the_result_comes_back() -> None:
    async def work() -> int:
        return 7

    assert await shielded(work()) == 7
