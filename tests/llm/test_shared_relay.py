"""The server's one relay: started on first use, shared, stopped at shutdown."""

from __future__ import annotations

from coding_agent_env.llm import RelayState, SharedRelay
from coding_agent_env.settings import Settings


async def test_started_once_shared_and_stopped(settings: Settings) -> None:
    shared = SharedRelay(settings)
    first = await shared.get()
    assert first is await shared.get() and first.state is RelayState.RUNNING
    await shared.stop()
    await shared.stop()
    assert first.state is RelayState.STOPPED
    again = await shared.get()
    assert again is not first and again.state is RelayState.RUNNING
    await shared.stop()
