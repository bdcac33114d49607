"""Reading an aiohttp body within a bound: for the relay (upstream answers) and Terminus (relay answers)."""

from __future__ import annotations

import aiohttp

__all__ = ["read_at_most"]


async def read_at_most(content: aiohttp.StreamReader, limit: int) -> bytes:
    """The body's bytes up to EOF or `limit`, whichever comes first. (`StreamReader.read(n)` returns as soon as
    anything is buffered, so one call can stop short of a body longer than one network read.)"""
    parts: list[bytes] = []
    size = 0
    while size < limit:
        chunk = await content.read(limit - size)
        if not chunk:
            break
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts)
