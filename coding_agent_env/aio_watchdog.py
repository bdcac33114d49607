"""An event-loop watchdog: how late the loop runs, and what held it when it stalled.

Two cheap parts:

- **the tick**, a callback the loop runs every `interval_s`. How late it runs (when it ran minus when it was
  due) is the loop's lag; the last and largest are kept. A tick costs one `call_at` and a few additions.
- **the watcher**, a daemon thread that wakes every `interval_s`. When the tick is overdue by `stall_s` or
  more, the loop thread is stuck in something (a blocking call, a long computation, a GC pause): the watcher
  takes that thread's current stack (`sys._current_frames()`) and the asyncio task it is running, counts one
  stall and logs one warning naming them, while the stall is still under way. A stall that ends between two
  looks of the watcher is still counted (by the late tick), without a stack.

`stats` is a consistent, frozen snapshot (ticks, lag, stalls, the last stall's stack) that any thread may
read at any time: tests assert "no stall during X" with it and the server serves it at `/health/loop`.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import traceback
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["LOGGED_FRAMES", "LoopStats", "LoopWatchdog", "Stall"]

log = logging.getLogger(__name__)

_MS = 1000.0
LOGGED_FRAMES = 12
"""Frames of the loop thread's stack a stall's warning shows, innermost last."""


@dataclass(frozen=True)
class Stall:
    """One stall: how long the loop had been held when it was seen, and what held it."""

    blocked_ms: float
    """How far past its due time the tick was when the stall was seen (the stall lasted at least this)."""
    task: str | None
    """The asyncio task the loop was running (`name (coroutine)`), None outside any task (a plain callback)."""
    stack: tuple[str, ...]
    """The loop thread's stack, outermost frame first, one formatted `File ..., line ..., in f` entry each;
    empty when the stall ended before the watcher could look."""


@dataclass(frozen=True)
class LoopStats:
    """A snapshot of the watchdog's figures since it started."""

    ticks: int
    lag_last_ms: float
    lag_max_ms: float
    stalls: int
    last_stall: Stall | None
    interval_ms: float
    stall_threshold_ms: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class LoopWatchdog:
    """Watches one event loop. `start()` on the loop's own thread while it runs; `stop()` there too.

    Usable once: `start()` after `stop()` raises RuntimeError, as does a second `start()`."""

    def __init__(self, interval_s: float, stall_s: float) -> None:
        if interval_s <= 0 or stall_s <= 0:
            raise ValueError("the watchdog's interval and stall threshold must be positive")
        self._interval = interval_s
        self._stall = stall_s
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread_id = 0
        self._watcher: threading.Thread | None = None
        self._handle: asyncio.TimerHandle | None = None
        # Guarded by _lock (the tick writes them on the loop thread, the watcher reads them).
        self._due = 0.0
        self._seq = 0
        self._reported_seq = -1
        self._ticks = 0
        self._lag_last = 0.0
        self._lag_max = 0.0
        self._stalls = 0
        self._last_stall: Stall | None = None

    @property
    def running(self) -> bool:
        """Whether the watcher thread is alive (from `start()` until `stop()` has returned)."""
        return self._watcher is not None and self._watcher.is_alive()

    @property
    def stats(self) -> LoopStats:
        with self._lock:
            return LoopStats(ticks=self._ticks, lag_last_ms=self._lag_last * _MS, lag_max_ms=self._lag_max * _MS,
                             stalls=self._stalls, last_stall=self._last_stall, interval_ms=self._interval * _MS,
                             stall_threshold_ms=self._stall * _MS)

    def start(self) -> None:
        """Begin watching the running loop of the calling thread (RuntimeError without one)."""
        if self._watcher is not None:
            raise RuntimeError("a LoopWatchdog starts once")
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._loop_thread_id = threading.get_ident()
        with self._lock:
            self._due = loop.time() + self._interval
        self._handle = loop.call_at(self._due, self._tick)
        self._watcher = threading.Thread(target=self._watch, name="loop-watchdog", daemon=True)
        self._watcher.start()

    def stop(self) -> None:
        """Stop ticking and end the watcher thread. Idempotent; synchronous (nothing to cancel), and brief: the
        watcher waits on an event this sets, so the join lasts at most one look at the loop."""
        self._stopping.set()
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        watcher = self._watcher
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join()

    # -- on the loop thread ------------------------------------------------------------------------------

    def _tick(self) -> None:
        loop = self._loop
        assert loop is not None
        now = loop.time()
        unseen: float | None = None
        with self._lock:
            lag = max(0.0, now - self._due)
            self._ticks += 1
            self._lag_last = lag
            self._lag_max = max(self._lag_max, lag)
            if lag >= self._stall and self._reported_seq != self._seq:
                # Over before the watcher looked (it looks once per interval): counted, with nothing to show.
                self._reported_seq = self._seq
                self._stalls += 1
                self._last_stall = Stall(blocked_ms=lag * _MS, task=None, stack=())
                unseen = lag
            self._seq += 1
            self._due = now + self._interval
            due = self._due
        if not self._stopping.is_set():
            self._handle = loop.call_at(due, self._tick)
        if unseen is not None:
            log.warning("event loop stalled %.0f ms (threshold %.0f ms); it ended before the watchdog could see "
                        "what held it", unseen * _MS, self._stall * _MS)

    # -- on the watcher thread ---------------------------------------------------------------------------

    def _watch(self) -> None:
        while not self._stopping.wait(self._interval):
            self._look()

    def _look(self) -> None:
        loop = self._loop
        assert loop is not None
        with self._lock:
            overdue = loop.time() - self._due  # loop.time() is a monotonic clock read: safe from any thread
            if overdue < self._stall or self._reported_seq == self._seq:
                return
            self._reported_seq = self._seq  # one report per stall: the next tick starts a new sequence number
        frame = sys._current_frames().get(self._loop_thread_id)
        stack = tuple(entry.rstrip("\n") for entry in traceback.format_stack(frame)) if frame is not None else ()
        del frame  # a frame reference keeps the loop thread's locals alive
        stall = Stall(blocked_ms=overdue * _MS, task=_describe(asyncio.current_task(loop)), stack=stack)
        with self._lock:
            self._stalls += 1
            self._last_stall = stall
        # The innermost frames say what holds the loop; the outer ones are the server's own (uvicorn, middleware)
        # and would bury them. The whole stack is in `stats.last_stall`.
        shown = stack[-LOGGED_FRAMES:]
        where = "\n".join(shown) if shown else "  (no stack: the loop thread is gone)"
        log.warning("event loop blocked for %.0f ms so far (threshold %.0f ms) in %s; the loop thread's innermost "
                    "%d of %d frames:\n%s", stall.blocked_ms, self._stall * _MS,
                    stall.task or "no task (a plain callback)", len(shown), len(stack), where)


def _describe(task: asyncio.Task[Any] | None) -> str | None:
    if task is None:
        return None
    coro = task.get_coro()
    name = getattr(coro, "__qualname__", None) or type(coro).__name__
    return f"{task.get_name()} ({name})"
