"""Session.run forwards progress events and an early-cancel event to its rollout (the web tab uses both), and
runs nothing in a session that is closed or closing."""

from __future__ import annotations

import asyncio

import pytest

from coding_agent_env.models import RolloutRequest, RolloutStatus
from coding_agent_env.rollout import events as ev
from coding_agent_env.session import SessionClosedError, SessionKind, SessionManager, SessionState
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


@pytest.mark.parametrize("how", ["closed", "closing"])
async def test_a_session_that_is_closed_or_closing_runs_nothing(
    settings: Settings, assert_no_leftovers: None, how: str
) -> None:
    manager = SessionManager(settings)
    session = manager.create(SessionKind.HTTP)
    started: list[ev.RolloutEvent] = []
    if how == "closed":
        await manager.close(session.id)  # a reference kept past the close (a WebSocket at shutdown, say)
    else:
        session.request_close()  # as `openenv/session/close` does while a WebSocket is attached
    request = RolloutRequest(instruction="x", agent="oracle", solution=["true"], verify=["true"])
    try:
        with pytest.raises(SessionClosedError, match=f"^Session {session.id} is {how}"):
            await session.run(request, emit=started.append)
        assert session.state is (SessionState.CLOSED if how == "closed" else SessionState.CLOSING)
    finally:
        await manager.stop()
    assert started == [] and session.rollouts_completed == 0
