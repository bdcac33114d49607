"""One session: an episode's state and at most one running rollout.

A session is created by the manager for a WebSocket, a JSON-RPC `openenv/session/create`, an MCP client or
the UI. It counts `step`s, remembers the last rollout's reward and status, and runs one rollout at a time.
It also holds at most one interactive episode (`start_episode`, then `terminal` calls): starting another, or
closing the session, ends the one before (its sandbox torn down). `close()` cancels a running rollout (the
pipeline tears its sandbox down before the cancellation returns), closes the episode, and is idempotent.

Lifecycle: OPEN -> (CLOSING ->) CLOSED. Only an OPEN session runs a rollout; `run` in any other state raises
`SessionClosedError`, so a reference kept past a close (a WebSocket at shutdown, a call racing a close)
cannot start one. CLOSING is a close asked for while a WebSocket is attached: the manager closes the session
when it detaches, and meanwhile it runs nothing new.

Observed (`observe.metrics`, when the manager hands the server's metrics down): every episode call is counted and
timed here, the one place every door's `terminal` and `keystrokes` pass, and every episode's end is counted by
the hook the session gives it (whatever ends it: a final answer, a timeout, a close).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from enum import Enum
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from coding_agent_env.env_state import EnvState
from coding_agent_env.episode import (
    Episode,
    EpisodeError,
    EpisodeReport,
    KeystrokesCall,
    TerminalCall,
    TerminalResult,
    parse_task,
)
from coding_agent_env.llm import SharedRelay
from coding_agent_env.errors import RequestError
from coding_agent_env.models import RolloutRequest, RolloutResult
from coding_agent_env.models.turns import policy_version_or_none
from coding_agent_env.observe.metrics import ServerMetrics
from coding_agent_env.observe.tracing import Tracing

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span
from coding_agent_env.rollout import run_rollout
from coding_agent_env.rollout.events import Emit
from coding_agent_env.sandbox.registry import Backends
from coding_agent_env.session.errors import SessionBusyError, SessionClosedError
from coding_agent_env.settings import Settings, WireLimits
from coding_agent_env.tasks.catalog import TaskCatalog

log = logging.getLogger(__name__)

__all__ = ["NoEpisodeError", "Session", "SessionKind", "SessionState"]

T = TypeVar("T")


class NoEpisodeError(EpisodeError):
    """A `terminal` call in a session with no episode: `reset` with a task starts one."""

    def __init__(self) -> None:
        super().__init__("no episode in this session: call reset with a task (instruction, setup, verify, ...) first")


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
        on_result: Sequence[Callable[[RolloutResult], None]] = (),
        catalog: TaskCatalog | None = None,
        metrics: ServerMetrics | None = None,
        tracing: Tracing | None = None,
        trace_parent: Context | None = None,
    ) -> None:
        """`on_result`: listeners that hear every rollout this session finishes, in order (the results store, by
        setting; the metrics); one that raises is logged and the next still hears it. `catalog`: the server's
        task set, which `reset(split=, index=)` and `run_rollout(split=, index=)` pick from. `metrics`: where
        episode calls and ends are counted (None: nowhere). `tracing`: where the session's rollouts and episodes
        are traced (`observe.tracing`), as children of `trace_parent` (the caller's trace, from its request)."""
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
        self.episode: Episode | None = None
        self._relay = relay
        self._backends = backends
        self._on_result = on_result
        self._metrics = metrics
        self._tracing = tracing if tracing is not None else Tracing()
        self.trace_parent = trace_parent
        self._episode_span: Span | None = None
        self.policy_version: str | None = None
        """The trainer's current policy / weight version (`reset(policy_version=...)`): the session's rollouts whose
        request names none record it on every turn."""
        self.catalog = catalog if catalog is not None else TaskCatalog()

    def set_policy_version(self, value: object) -> None:
        """Set (a string) or clear (None or "") the session's policy version; `RequestError` for a value that is
        not one (visible ASCII, no spaces, bounded)."""
        if value is None or value == "":
            self.policy_version = None
            return
        checked = policy_version_or_none(value)
        if checked is None:
            raise RequestError("policy_version must be visible ASCII without spaces, "
                               f"at most {WireLimits.MAX_NAME_CHARS} characters")
        self.policy_version = checked

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

    def snapshot(self) -> EnvState:
        """The session's `state`, with `episode` (its report) once an interactive episode was started."""
        self.touch()
        episode = {} if self.episode is None else {"episode": self.episode.report().model_dump(mode="json")}
        return EnvState(
            episode_id=self.episode_id,
            step_count=self.step_count,
            rollouts_completed=self.rollouts_completed,
            last_reward=self.last_reward,
            last_status=self.last_status,
            **episode,
        )

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

    @property
    def live_episode(self) -> Episode | None:
        """The episode taking `terminal` calls, if any."""
        return self.episode if self.episode is not None and not self.episode.done else None

    def idle_for(self, now: float) -> float:
        """Seconds since the last activity; 0 while a rollout runs or a WebSocket is attached."""
        if self.busy or self.attached or (self.episode is not None and self.episode.busy):
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
        self._check_open()
        if self.busy:
            raise SessionBusyError(self.id)
        self.touch()
        started_ns = time.time_ns()
        if request.policy_version is None and self.policy_version is not None:
            request = request.model_copy(update={"policy_version": self.policy_version})
        task = asyncio.ensure_future(
            run_rollout(
                request, settings=self.settings, relay=self._relay, backends=self._backends, emit=emit, cancel=cancel,
                caller=self.id,
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
        for listener in self._on_result:
            try:
                listener(result)
            except Exception:  # keeping a record must never cost the caller its result
                log.exception("session %s: recording rollout %s failed", self.id, result.rollout_id)
        try:
            self._tracing.rollout(result, started_ns=started_ns, parent=self.trace_parent)
        except Exception:  # likewise for its trace
            log.exception("session %s: tracing rollout %s failed", self.id, result.rollout_id)
        return result

    # -- interactive episodes --------------------------------------------------------------------------

    async def start_episode(
        self, task: RolloutRequest | Mapping[str, Any], episode_id: str | None = None
    ) -> Episode:
        """End this session's episode if any, then start one for `task` (a `RequestError` for a task this server
        will not run; `SessionClosedError`). The episode returned is running, or already done (its setup failed).

        The server's doors pass the task validated (`api.tools`: `parse_task`); an in-process caller may pass
        reset's arguments as they are, which are then validated the same way (`TaskArgumentsError`)."""
        self._check_open()
        if not isinstance(task, RolloutRequest):
            task = parse_task(task)
        backends = self._backends
        if backends is None:
            raise RuntimeError("a session runs episodes only with the app's sandbox backends (SessionManager's)")
        Episode.check(task, settings=self.settings, backends=backends)  # a refused task leaves the live one be
        await self.end_episode()
        self.reset(episode_id)
        assert self.episode_id is not None
        span = self._episode_span = self._tracing.start_episode(self.episode_id, task.task_id,
                                                                task.sandbox or self.settings.default_backend,
                                                                self.trace_parent)
        metrics = self._metrics

        def on_end(status: str) -> None:
            if metrics is not None:
                metrics.episode_finished(status)
            self._tracing.end_episode(span, status)

        episode = await Episode.start(task, settings=self.settings, backends=backends, episode_id=self.episode_id,
                                      on_end=on_end, caller=self.id)
        self.episode = episode
        self.touch()
        return episode

    async def terminal(self, call: TerminalCall) -> TerminalResult | EpisodeReport:
        """One validated `terminal` call (`api.tools`: `parse_terminal`) in this session's episode: a command's
        result, or for a final answer the episode's report. `EpisodeError`s (no episode, busy, ended) and
        `SessionClosedError`."""
        self._check_open()
        if self.episode is None:
            raise NoEpisodeError()
        self.touch()
        try:
            if call.command is not None:
                return await self._timed("terminal", self.episode.terminal(call.command))
            assert call.final_answer is not None
            report = await self._timed("final_answer", self.episode.final_answer(call.final_answer))
        finally:
            self.touch()
        if report.task_id:  # the task set's sampler learns from the episode (a task not of the set: nothing)
            self.catalog.observe(report.task_id, report.reward, sum(c.seconds for c in report.calls.values()))
        self.last_reward, self.last_status = report.reward, report.status.value
        return report

    async def keystrokes(self, call: KeystrokesCall) -> TerminalResult:
        """One validated `keystrokes` call in this session's episode (see `Episode.keystrokes`)."""
        self._check_open()
        if self.episode is None:
            raise NoEpisodeError()
        self.touch()
        try:
            return await self._timed("keystrokes", self.episode.keystrokes(call.keys, call.duration_s))
        finally:
            self.touch()

    async def _timed(self, name: str, call: Awaitable[T]) -> T:
        """Await one episode call, counting it (a failure when it raises, cancellation included) and its time, in
        a span of its own under the episode's."""
        with self._tracing.step(self._episode_span, f"episode.{name}"):
            if self._metrics is None:
                return await call
            started = time.monotonic()
            failed = True
            try:
                result = await call
                failed = False
                return result
            finally:
                self._metrics.episode_call(name, time.monotonic() - started, failed=failed)

    async def end_episode(self) -> None:
        """Close this session's episode, if any (torn down; idempotent)."""
        episode, self.episode = self.episode, None
        if episode is not None:
            await episode.close()

    def _check_open(self) -> None:
        if self.state is not SessionState.OPEN:
            raise SessionClosedError(self.id, closing=self.state is SessionState.CLOSING)

    async def close(self) -> None:
        """Mark closed, cancel a running rollout and close the episode, waiting for their teardown. Idempotent."""
        self.state = SessionState.CLOSED
        try:
            await self._cancel_rollout()
        finally:
            await self.end_episode()

    async def _cancel_rollout(self) -> None:
        task = self._rollout
        if task is None or task.done():
            return
        task.cancel()
        await asyncio.wait({task})
