"""Session.run forwards progress events and an early-cancel event to its rollout (the web tab uses both)."""

from __future__ import annotations

import asyncio

from coding_agent_env.models import RolloutRequest, RolloutStatus
from coding_agent_env.rollout import events as ev
from coding_agent_env.session import SessionManager
from coding_agent_env.session.session import SessionKind
from coding_agent_env.settings import Settings


async def test_events_and_cancel_reach_the_rollout(settings: Settings, assert_no_leftovers: None) -> None:
    manager = SessionManager(settings)
    session = manager.create(SessionKind.UI)
    cancel = asyncio.Event()
    seen: list[str] = []

    def on_event(event: ev.RolloutEvent) -> None:
        seen.append(event.type)
        if isinstance(event, ev.PhaseStarted) and event.phase == "agent":
            cancel.set()

    try:
        request = RolloutRequest(instruction="x", agent="oracle", solution=["sleep 1000"], verify=["true"])
        result = await asyncio.wait_for(session.run(request, emit=on_event, cancel=cancel), 60)
    finally:
        await manager.stop()
    assert result.status is RolloutStatus.CANCELLED and seen[0] == "rollout_started" and seen[-1] == "rollout_finished"
    assert session.rollouts_completed == 1
