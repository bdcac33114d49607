"""asyncio helpers shared by the layers that tear things down."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["shielded"]

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
