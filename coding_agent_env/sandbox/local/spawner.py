"""Process starts off the event loop: `subprocess.Popen` on a few spawn threads of the server's own.

Starting a process holds the calling thread until the child has exec'd: with vfork (what Python uses when no
credentials change) the parent is suspended until the child calls exec, and with fork (credentials to switch)
the whole server's memory map is copied first. On a loaded machine that is the scheduler's time, not ours:
with 128 rollouts on 2 cores the child waited hundreds of milliseconds for a CPU, and so did the event loop,
and every request with it (`/health` at 1 s, the watchdog's stalls in `_execute_child`). On a spawn thread
the wait is that thread's alone: the interpreter lock is released while the parent waits. (A fork still stops
the whole process while the kernel copies its memory map: the root launchers keep the server's spawns on vfork,
see `launch`.)

`SPAWN_THREADS` starts may wait on the scheduler at once; more queue (in order) behind them. A start is never
abandoned half-way: a caller cancelled meanwhile gets its cancellation once the child exists, and the child is
then the caller's to kill (`proc.start` does).
"""

from __future__ import annotations

import asyncio
import functools
import subprocess
from collections.abc import Callable
from typing import Any

from coding_agent_env.aio import SharedPool

__all__ = ["SPAWN_THREADS", "popen", "spawn_threads"]

SPAWN_THREADS = 4
"""Process starts under way at once (each holds its thread only until its child has exec'd)."""

spawn_threads = SharedPool(SPAWN_THREADS, "cae-spawn")
"""The server's spawn threads (`spawn_threads()`), made on first use, shared by every event loop."""


async def popen(
    argv: list[str], on_cancelled: Callable[[subprocess.Popen[bytes]], None], **options: Any
) -> subprocess.Popen[bytes]:
    """`subprocess.Popen(argv, **options)` on a spawn thread; its errors (`OSError`: no such program, ...) are
    raised here. Cancelled meanwhile: waits for the start to end, hands the child it made (if any) to
    `on_cancelled` (on the loop's thread, at once), then re-raises the cancellation."""
    loop = asyncio.get_running_loop()
    call = loop.run_in_executor(spawn_threads(), functools.partial(subprocess.Popen, argv, **options))
    try:
        return await asyncio.shield(call)
    except asyncio.CancelledError:
        while not call.done():
            try:
                await asyncio.wait([call])
            except asyncio.CancelledError:
                continue  # cancelled again: the child still has to be handed over
        if not call.cancelled() and call.exception() is None:
            on_cancelled(call.result())
        raise
