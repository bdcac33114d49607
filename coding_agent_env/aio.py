"""asyncio helpers shared by the layers that tear things down."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

__all__ = ["SharedPool", "off_loop", "shielded"]

T = TypeVar("T")


async def shielded(work: Awaitable[T]) -> T:
    """Await `work` to its end even if we are cancelled meanwhile (any number of times), then re-raise the
    cancellation. For teardown, which must finish whatever happens to its caller."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return task.result()


async def off_loop(function: Callable[..., T], *args: object) -> T:
    """`function(*args)` on a worker thread. Cancelled meanwhile, it still waits for the call to end (the caller
    must keep each call bounded), so whatever the call touches is never used by two threads at once."""
    call = asyncio.ensure_future(asyncio.to_thread(function, *args))
    try:
        return await asyncio.shield(call)
    except asyncio.CancelledError:
        await asyncio.wait([call])
        raise


class SharedPool:
    """A thread pool of its own for one kind of work, made on first use (one per process, shared by every event
    loop): `pool()` gives it. Threads of their own keep that work from queueing behind `asyncio.to_thread`'s."""

    def __init__(self, workers: int, name: str) -> None:
        self._workers, self._name = workers, name
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    def __call__(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix=self._name)
            return self._pool
