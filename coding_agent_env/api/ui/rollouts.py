"""Rollouts started from the web tab: one UI session per rollout, a live event feed, and cancel.

Contract:
- `UiRuns.stream(owner, request)` takes a `SessionKind.UI` slot from the shared session manager (so the tab
  counts against `max_concurrent_envs` like every WebSocket, JSON-RPC and MCP session; `CapacityError` if
  full), runs the rollout through that session's `Session.run` (so it uses the server's one LLM relay, as
  every session does) with the pipeline's `emit` and `cancel` hooks, and yields `Progress` snapshots:
  the event log so far, then a last one carrying the `RolloutResult`. The slot is freed when the stream ends,
  however it ends. `owner` is the browser session; one rollout per owner at a time (`SessionBusyError`).
- `cancel(owner)` asks the owner's rollout to stop: the pipeline tears the sandbox down and the stream ends with
  a `cancelled` result. A stream closed early (the browser went away) cancels the same way and waits for
  teardown before freeing the slot.
- `stop()` (server shutdown) cancels every UI rollout and waits for their teardown.

Everything runs on the server's event loop (Gradio runs async handlers there).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from coding_agent_env.api.ui.render import event_line
from coding_agent_env.models import RolloutRequest, RolloutResult
from coding_agent_env.rollout import events as ev
from coding_agent_env.session import SessionBusyError, SessionKind, SessionManager

__all__ = ["Progress", "UiRuns"]


@dataclass(frozen=True)
class Progress:
    """A snapshot of one UI rollout: log lines so far and, at the end, the result."""

    lines: tuple[str, ...]
    result: RolloutResult | None = None


class UiRuns:
    """The web tab's running rollouts, keyed by browser session."""

    def __init__(self, manager: SessionManager) -> None:
        self._manager = manager
        self._cancels: dict[str, asyncio.Event] = {}
        self._tasks: set[asyncio.Task[RolloutResult]] = set()

    def running(self, owner: str) -> bool:
        return owner in self._cancels

    def cancel(self, owner: str) -> bool:
        """Ask the owner's rollout to stop; False if it has none running."""
        event = self._cancels.get(owner)
        if event is None:
            return False
        event.set()
        return True

    async def stop(self) -> None:
        for event in self._cancels.values():
            event.set()
        if self._tasks:
            await asyncio.wait(set(self._tasks))

    async def stream(self, owner: str, request: RolloutRequest) -> AsyncIterator[Progress]:
        """Run `request` in a fresh UI session and yield its progress; see the module contract."""
        if owner in self._cancels:
            raise SessionBusyError(owner)
        session = self._manager.create(SessionKind.UI)
        cancel = asyncio.Event()
        self._cancels[owner] = cancel
        queue: asyncio.Queue[ev.RolloutEvent] = asyncio.Queue()
        task = asyncio.ensure_future(session.run(request, emit=queue.put_nowait, cancel=cancel))
        self._tasks.add(task)
        try:
            async for progress in _follow(task, queue, self._manager.settings.web_max_events):
                yield progress
        finally:
            cancel.set()
            await asyncio.shield(asyncio.wait({task}))
            self._tasks.discard(task)
            del self._cancels[owner]
            await self._manager.close(session.id)


async def _follow(
    task: asyncio.Task[RolloutResult], queue: asyncio.Queue[ev.RolloutEvent], max_lines: int
) -> AsyncIterator[Progress]:
    """Yield the log after each batch of events until the task ends; then the result (or its error)."""
    started = time.monotonic()
    lines: list[str] = []
    while True:
        getter = asyncio.ensure_future(queue.get())
        try:
            await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            getter.cancel()
        batch = [getter.result()] if getter.done() and not getter.cancelled() else []
        while not queue.empty():
            batch.append(queue.get_nowait())
        lines.extend(event_line(event, time.monotonic() - started) for event in batch)
        del lines[:-max_lines]
        if task.done():
            yield Progress(tuple(lines), task.result())  # a RequestError raised before the start surfaces here
            return
        if batch:
            yield Progress(tuple(lines))
