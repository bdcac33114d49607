"""A list of tasks as one JSON object, streamed: serialised `CHUNK_TASKS` at a time on a worker thread.

A split can hold 100,000 tasks (27 MB of JSON). Built as one dict and encoded by FastAPI on the event loop,
six clients asking for it held `/health` for 2 s. Here the loop's work per request is bounded: each chunk of
tasks is encoded off the loop (the public views made there too) and sent before the next is made, so a slow
client holds one chunk in memory, never the whole answer, and the loop only moves bytes.

Every answer's chunks are encoded on one thread of their own, in turn: encoding is pure Python, so more
threads would not encode faster, only contend more with the loop for the interpreter lock.

The bytes are the JSON FastAPI's `JSONResponse` makes (`ensure_ascii=False`, no spaces), keys in the order given.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from starlette.responses import StreamingResponse

from coding_agent_env.aio import SharedPool
from coding_agent_env.tasks.catalog import CatalogTask

__all__ = ["CHUNK_TASKS", "tasks_response"]

CHUNK_TASKS = 500
"""Tasks serialised per step on the worker thread (about 130 kB of JSON for tasks of typical instructions)."""


_encoder = SharedPool(1, "cae-task-encode")
"""The one thread answers are encoded on (one at a time: a flood waits there, never on the loop)."""


async def _off_loop(tasks: Sequence[CatalogTask], first: bool) -> bytes:
    """`_chunk` on the encoding thread; cancelled meanwhile (the client went away), it still waits for it."""
    call = asyncio.get_running_loop().run_in_executor(_encoder(), _chunk, tasks, first)
    try:
        return await asyncio.shield(call)
    except asyncio.CancelledError:
        await asyncio.wait([call])
        raise


def _encode(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _chunk(tasks: Sequence[CatalogTask], first: bool) -> bytes:
    text = ",".join(_encode(task.public()) for task in tasks)
    return (text if first else "," + text).encode()


async def _body(tasks: Sequence[CatalogTask], extra: Mapping[str, Any]) -> AsyncIterator[bytes]:
    yield b'{"tasks":['
    for start in range(0, len(tasks), CHUNK_TASKS):
        yield await _off_loop(tasks[start:start + CHUNK_TASKS], start == 0)
    tail = "".join(f",{_encode(key)}:{_encode(value)}" for key, value in extra.items())
    yield f"]{tail}}}".encode()


def tasks_response(tasks: Sequence[CatalogTask], extra: Mapping[str, Any] | None = None) -> StreamingResponse:
    """`{"tasks": [public view, ...], **extra}` as a streamed `application/json` response."""
    return StreamingResponse(_body(tasks, extra or {}), media_type="application/json")
