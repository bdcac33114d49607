"""The server process's garbage collector and GIL, kept off the event loop's tail.

What it fixes (measured with the loop watchdog and `gc.callbacks`, bench/ws.py): a full collection scans every
object the collector tracks, and a served app holds some 250,000 (FastAPI, the MCP SDK, pydantic's models, the
Gradio tab); each took 60-140 ms on the loop thread, several times a minute under load. Objects made at startup
live as long as the process, so they are frozen out of the collector (`gc.freeze`) once startup is done: later
collections scan only what was made since. While the Gradio tab is imported and built on a worker thread (some
5 s of CPU, ~100,000 objects), the collector is paused (each full collection over the growing heap held the loop
too) and the interpreter's switch interval is shortened, so the loop thread gets the GIL back from the builder
within a fraction of a millisecond instead of 5 ms per hand-over.

These are process-wide knobs: the counts below make nested and concurrent users (several apps in one test
process) compose; the last one out restores what the first one in found.
"""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["BUILD_SWITCH_INTERVAL_S", "building", "freeze", "thaw"]

BUILD_SWITCH_INTERVAL_S = 0.0005
"""The GIL hand-over interval while a background build runs (CPython's default is 5 ms): a loop thread that
wants the GIL waits at most this long for the builder to let go of it."""

_lock = threading.Lock()
_builds = 0
_saved: tuple[bool, float] | None = None


def freeze() -> None:
    """Freeze everything alive: after startup, and after a background build. Nothing is collected first (a full
    collection costs what this avoids, and in a process holding many apps, as tests do, much more): the little
    cyclic garbage startup left stays until `thaw()`."""
    gc.freeze()


def thaw() -> None:
    """Give the frozen objects back to the collector (at shutdown: an app stopped in a process that goes on,
    as in tests, is then collectable)."""
    gc.unfreeze()


@contextmanager
def building() -> Iterator[None]:
    """Around a long background build (imports, object graphs): the collector paused and a short switch
    interval; on exit what was built is frozen and both are restored (by the last build to end)."""
    global _builds, _saved
    with _lock:
        if _builds == 0:
            _saved = (gc.isenabled(), sys.getswitchinterval())
            gc.disable()
            sys.setswitchinterval(BUILD_SWITCH_INTERVAL_S)
        _builds += 1
    try:
        yield
    finally:
        with _lock:
            _builds -= 1
            if _builds == 0 and _saved is not None:
                enabled, interval = _saved
                _saved = None
                sys.setswitchinterval(interval)
                freeze()
                if enabled:
                    gc.enable()
