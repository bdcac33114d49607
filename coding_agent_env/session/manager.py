"""The session manager: one capacity for every kind of session, attach, and idle reaping.

Contract:
- `create(kind)` takes one of `settings.max_concurrent_envs` slots or raises `CapacityError(active, max)`.
  WebSocket, JSON-RPC, MCP and UI sessions all draw from this one pool.
- `get(id)` returns a live session or raises `UnknownSessionError`; unknown ids are never a `KeyError`.
- `close(id)` frees the slot at once and cancels the session's rollout (teardown is awaited). Idempotent.
- `attach(id)` binds a WebSocket to an HTTP-created session (`SessionAttachedError` if one already is);
  `detach` unbinds it, closing the session if an `openenv/session/close` arrived meanwhile.
- `reap_idle()` closes HTTP-created, MCP and UI sessions idle longer than `settings.session_idle_timeout_s`;
  `start()` runs it periodically until `stop()`, which also closes every session.
- `on_result` is a list of listeners every session's finished rollout goes to, in order (the results store, the
  metrics); `metrics` (the app's `observe.metrics.ServerMetrics`) is handed to every session, and `live_counts()`
  is what its live gauges read.

All methods run on the server's event loop; the table is only touched there, between awaits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping

from coding_agent_env.llm import SharedRelay
from coding_agent_env.models import RolloutResult
from coding_agent_env.observe.metrics import LiveCounts, ServerMetrics
from coding_agent_env.observe.tracing import Tracing
from coding_agent_env.sandbox.registry import Backends
from coding_agent_env.session.errors import CapacityError, SessionAttachedError, UnknownSessionError
from coding_agent_env.session.session import Session, SessionKind
from coding_agent_env.settings import Settings
from coding_agent_env.tasks.catalog import TaskCatalog

__all__ = ["SessionManager"]

log = logging.getLogger(__name__)

_REAPED_KINDS = (SessionKind.HTTP, SessionKind.MCP, SessionKind.UI)
"""Kinds with no connection whose end would close them: only the idle timeout does (a UI session running a
rollout is never idle; one holding an interactive episode whose browser went away is reaped)."""


class SessionManager:
    """Owns every live session of one app."""

    def __init__(self, settings: Settings, backends: Backends | None = None, catalog: TaskCatalog | None = None,
                 metrics: ServerMetrics | None = None) -> None:
        """`backends`: the app's sandbox backends (it closes them); without them the manager builds its own
        and closes them in `stop()`. `catalog`: the server's task set (`tasks.catalog`), shared by every session.
        `metrics`: where the sessions count episode calls and ends (None: nowhere)."""
        self.settings = settings
        self.catalog = catalog if catalog is not None else TaskCatalog()
        self._sessions: dict[str, Session] = {}
        self._reaper: asyncio.Task[None] | None = None
        self.relay = SharedRelay(settings)
        self._own_backends = backends is None
        self.backends = Backends(settings) if backends is None else backends
        self.metrics = metrics
        self.tracing = Tracing()
        """The app's tracer (`observe.tracing`; off unless the app sets one before sessions are made)."""
        self.on_result: list[Callable[[RolloutResult], None]] = []
        """Listeners that hear every rollout a session of this manager finishes (added before sessions are made;
        each session reads this one list)."""

    @property
    def active(self) -> int:
        return len(self._sessions)

    @property
    def capacity(self) -> int:
        return self.settings.max_concurrent_envs

    def create(self, kind: SessionKind, headers: Mapping[str, str] | None = None) -> Session:
        """Take a slot for a new session, or raise CapacityError. `headers`: the request that made it, whose W3C
        `traceparent` (if any) the session's spans continue (`observe.tracing`)."""
        if self.active >= self.capacity:
            raise CapacityError(self.active, self.capacity)
        session = Session(kind, self.settings, relay=self.relay, backends=self.backends, on_result=self.on_result,
                          catalog=self.catalog, metrics=self.metrics, tracing=self.tracing,
                          trace_parent=self.tracing.parent(headers) if headers is not None else None)
        self._sessions[session.id] = session
        log.info("session %s (%s) created: %d/%d", session.id, kind.value, self.active, self.capacity)
        return session

    def live_counts(self) -> LiveCounts:
        """Sessions by kind, live episodes and the capacity, now (on the event loop, as every method)."""
        kinds: dict[str, int] = {}
        for session in self._sessions.values():
            kinds[session.kind.value] = kinds.get(session.kind.value, 0) + 1
        episodes = sum(1 for session in self._sessions.values() if session.live_episode is not None)
        templates = self.backends.templates.counts()
        return LiveCounts(sessions=kinds, episodes=episodes, capacity=self.capacity, templates=templates.held,
                          templates_idle=templates.idle, template_bytes=templates.bytes)

    def get(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise UnknownSessionError(session_id)
        return session

    async def close(self, session_id: str) -> None:
        """Free the slot and cancel the session's rollout. Unknown ids are ignored."""
        session = self._sessions.pop(session_id, None)
        if session is None:
            return
        log.info("session %s closed: %d/%d", session_id, self.active, self.capacity)
        await session.close()

    def attach(self, session_id: str) -> Session:
        session = self.get(session_id)
        if session.attached:
            raise SessionAttachedError(session_id)
        session.attached = True
        session.touch()
        return session

    async def detach(self, session: Session) -> None:
        """Unbind the WebSocket; close the session if a close was requested while attached."""
        session.attached = False
        session.touch()
        if session.close_requested:
            await self.close(session.id)

    async def reap_idle(self, now: float | None = None) -> list[str]:
        """Close reapable sessions idle longer than the timeout; return their ids."""
        now = time.monotonic() if now is None else now
        timeout = self.settings.session_idle_timeout_s
        idle = [
            s.id for s in self._sessions.values() if s.kind in _REAPED_KINDS and s.idle_for(now) > timeout
        ]
        for session_id in idle:
            log.info("session %s reaped after %.0fs idle", session_id, timeout)
            await self.close(session_id)
        return idle

    def start(self) -> None:
        """Start the periodic idle reaper (on the running loop)."""
        if self._reaper is None:
            self._reaper = asyncio.get_running_loop().create_task(self._reap_forever())

    async def stop(self) -> None:
        """Stop the reaper and close every session (their rollouts are cancelled and torn down)."""
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
            self._reaper = None
        for session_id in list(self._sessions):
            await self.close(session_id)
        await self.relay.stop()
        if self._own_backends:
            await self.backends.aclose()

    async def _reap_forever(self) -> None:
        interval = self.settings.session_reap_interval_s
        while True:
            await asyncio.sleep(interval)
            await self.reap_idle()
