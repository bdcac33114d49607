"""One session: an episode's state and at most one running rollout.

A session is created by the manager for a WebSocket, a JSON-RPC `openenv/session/create`, an MCP client or
the UI. It counts `step`s, remembers the last rollout's reward and status, and runs one rollout at a time.
`close()` cancels a running rollout (the pipeline tears its sandbox down before the cancellation returns)
and is idempotent.

Lifecycle: OPEN -> (CLOSING ->) CLOSED. Only an OPEN session runs a rollout; `run` in any other state raises
`SessionClosedError`, so a reference kept past a close (a WebSocket at shutdown, a call racing a close)
cannot start one. CLOSING is a close asked for while a WebSocket is attached: the manager closes the session
when it detaches, and meanwhile it runs nothing new.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from enum import Enum
from typing import Any

from coding_agent_env.llm import SharedRelay
from coding_agent_env.models import RolloutRequest, RolloutResult
from coding_agent_env.rollout import run_rollout
from coding_agent_env.rollout.events import Emit
from coding_agent_env.sandbox.registry import Backends
from coding_agent_env.session.errors import SessionBusyError, SessionClosedError
from coding_agent_env.settings import Settings

__all__ = ["Session", "SessionKind", "SessionState"]


class SessionKind(str, Enum):
    """Who created the session; HTTP-created kinds are reaped when idle, connection-bound ones on disconnect."""

    WS = "ws"
    HTTP = "http"
    MCP = "mcp"
    UI = "ui"


class SessionState(Enum):
    OPEN = "open"
    CLOSING = "closing"
    """Closed as soon as its WebSocket detaches; runs nothing new meanwhile."""
    CLOSED = "closed"


class Session:
    """Per-connection state. Lives on the server's event loop; not thread-safe by design."""

    def __init__(
        self,
        kind: SessionKind,
        settings: Settings,
        session_id: str | None = None,
        relay: SharedRelay | None = None,
        backends: Backends | None = None,
    ) -> None:
        self.id = session_id or str(uuid.uuid4())
        self.kind = kind
        self.settings = settings
        self.state = SessionState.OPEN
        self.episode_id: str | None = None
        self.step_count = 0
        self.rollouts_completed = 0
        self.last_reward: float | None = None
        self.last_status: str | None = None
        self.attached = False
        self.last_active = time.monotonic()
        self._rollout: asyncio.Task[RolloutResult] | None = None
        self._relay = relay
        self._backends = backends

    # -- episode ---------------------------------------------------------------------------------------

    def reset(self, episode_id: str | None = None) -> None:
        """Start a new episode: a fresh (or the caller's) episode id, step count 0."""
        self.touch()
        self.episode_id = episode_id if episode_id is not None else str(uuid.uuid4())
        self.step_count = 0

    def count_step(self) -> None:
        self.touch()
        if self.episode_id is None:
            self.episode_id = str(uuid.uuid4())
        self.step_count += 1

    def snapshot(self) -> dict[str, Any]:
        """The `state` payload: episode_id, step_count, rollouts_completed, last_reward, last_status."""
        self.touch()
        return {
            "episode_id": self.episode_id,
            "step_count": self.step_count,
            "rollouts_completed": self.rollouts_completed,
            "last_reward": self.last_reward,
            "last_status": self.last_status,
        }

    def touch(self) -> None:
        self.last_active = time.monotonic()

    @property
    def close_requested(self) -> bool:
        """A close was asked for while a WebSocket is attached; the manager closes the session at detach."""
        return self.state is SessionState.CLOSING

    def request_close(self) -> None:
        """Refuse new rollouts from now on and let the manager close the session when its WebSocket detaches."""
        if self.state is SessionState.OPEN:
            self.state = SessionState.CLOSING

    @property
    def busy(self) -> bool:
        return self._rollout is not None and not self._rollout.done()

    def idle_for(self, now: float) -> float:
        """Seconds since the last activity; 0 while a rollout runs or a WebSocket is attached."""
        if self.busy or self.attached:
            return 0.0
        return now - self.last_active

    # -- rollouts --------------------------------------------------------------------------------------

    async def run(
        self, request: RolloutRequest, *, emit: Emit | None = None, cancel: asyncio.Event | None = None
    ) -> RolloutResult:
        """Run one rollout in this session. `SessionClosedError` unless the session is open, `SessionBusyError`
        if a rollout is already running.

        Cancelling the caller cancels the rollout (its sandbox is torn down first); setting `cancel` ends it
        early with status `cancelled` instead. `emit` receives the rollout's progress events."""
        if self.state is not SessionState.OPEN:
            raise SessionClosedError(self.id, closing=self.state is SessionState.CLOSING)
        if self.busy:
            raise SessionBusyError(self.id)
        self.touch()
        task = asyncio.ensure_future(
            run_rollout(
                request, settings=self.settings, relay=self._relay, backends=self._backends, emit=emit, cancel=cancel
            )
        )
        self._rollout = task
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError:
            await self._cancel_rollout()
            raise
        finally:
            self.touch()
        self.rollouts_completed += 1
        self.last_reward = result.reward
        self.last_status = result.status.value
        return result

    async def close(self) -> None:
        """Mark closed and cancel a running rollout, waiting for its teardown. Idempotent."""
        self.state = SessionState.CLOSED
        await self._cancel_rollout()

    async def _cancel_rollout(self) -> None:
        task = self._rollout
        if task is None or task.done():
            return
        task.cancel()
        await asyncio.wait({task})
