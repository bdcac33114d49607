"""Many rollouts at once, some cancelled mid-agent: nothing may be left behind."""

from __future__ import annotations

import asyncio

from coding_agent_env.models import RolloutRequest, RolloutStatus
from coding_agent_env.rollout import events as ev
from coding_agent_env.rollout import run_rollout
from coding_agent_env.settings import Settings
from tests.helpers import leftovers

ROLLOUTS = 50
CONCURRENCY = 10


async def test_fifty_rollouts_some_cancelled_leave_nothing(settings: Settings) -> None:
    request = RolloutRequest(
        instruction="write the answer",
        agent="oracle",
        setup=["echo setup > s.txt"],
        solution=["(trap '' TERM; sleep 0.3; echo 42 > answer) & wait"],
        verify=["grep -qx 42 answer"],
    )
    gate = asyncio.Semaphore(CONCURRENCY)
    outcomes: list[str] = []

    async def one(index: int) -> None:
        async with gate:
            in_agent = asyncio.Event()

            def on_event(event: ev.RolloutEvent) -> None:
                if isinstance(event, ev.PhaseStarted) and event.phase == "agent":
                    in_agent.set()

            task = asyncio.ensure_future(run_rollout(request, settings=settings, emit=on_event))
            if index % 3 == 0:
                await asyncio.wait_for(in_agent.wait(), 30)
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    outcomes.append("cancelled")
                    return
            result = await task
            outcomes.append("passed" if result.status is RolloutStatus.COMPLETED and result.reward == 1.0 else repr(result))

    await asyncio.gather(*(one(i) for i in range(ROLLOUTS)))
    assert outcomes.count("cancelled") == len(range(0, ROLLOUTS, 3))
    assert outcomes.count("passed") == ROLLOUTS - outcomes.count("cancelled"), outcomes
    assert leftovers(settings) == {}
