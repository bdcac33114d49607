"""`GroupTemplates`: each group's set-up state, made once by its first member and shared by all of them.

A group (rollouts or episodes that start from the same task, as GRPO runs a task G times) is keyed by its
`group_id` and everything its sandbox and setup depend on (the caller's key). The first member to `join` starts
making the group's value (a backend's `SandboxTemplate` and the setup's results, or the setup's failure): in a
task of its own, under the caller's deadline, so a first member cancelled or crashed does not take the others'
setup with it. Every member awaits the same value; an exception while making it reaches every member waiting
and is not kept (the next member to join makes it anew).

Lifetime: members `leave` (each once). The value is released once no member holds it and none joined for
`idle_s` (members of a group may run a few at a time), or when `aclose` ends the registry; a value still being
made when its last member leaves is cancelled (its making cleans up after itself); what is released is
the caller's `release(value)`, called once, shielded. Only the event loop's thread uses a registry.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from coding_agent_env.aio import shielded

__all__ = ["GroupLease", "GroupTemplates"]

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(eq=False)
class _Entry(Generic[T]):
    making: asyncio.Task[T]
    release: Callable[[T], Awaitable[None]]
    holders: int = 0
    idle: asyncio.TimerHandle | None = None
    releasing: asyncio.Task[None] | None = None


@dataclass(eq=False)
class GroupLease(Generic[T]):
    """One member's hold on its group's value: `value` (awaited), `created` whether this member's join started
    making it; `leave()` once done with it (idempotent)."""

    registry: GroupTemplates
    key: Hashable
    entry: _Entry[T]
    created: bool
    _left: bool = field(default=False, init=False)

    async def value(self) -> T:
        """The group's value, once made; the exception that made it fail, if it did."""
        return await asyncio.shield(self.entry.making)

    def leave(self) -> None:
        if not self._left:
            self._left = True
            self.registry._leave(self.key, self.entry)


class GroupTemplates:
    """See the module docstring."""

    def __init__(self, *, idle_s: float = 30.0) -> None:
        self.idle_s = idle_s
        self._entries: dict[Hashable, _Entry[object]] = {}
        self._releasing: set[asyncio.Task[None]] = set()
        self._closed = False

    def __len__(self) -> int:
        """Groups whose value is held (being made, in use or idle)."""
        return len(self._entries)

    def join(
        self,
        key: Hashable,
        make: Callable[[], Awaitable[T]],
        release: Callable[[T], Awaitable[None]],
    ) -> GroupLease[T]:
        """Hold group `key`'s value, starting `make()` when no live one exists (`release` then frees what it
        makes). A group whose making failed is made anew by the next join."""
        if self._closed:
            raise RuntimeError("the group registry is closed")
        entry = self._entries.get(key)
        if entry is not None and entry.making.done() and (
            entry.making.cancelled() or entry.making.exception() is not None
        ):
            self._entries.pop(key, None)
            entry = None
        created = entry is None
        if entry is None:
            making: asyncio.Task[T] = asyncio.ensure_future(make())  # type: ignore[assignment]
            entry = _Entry(making, release)  # type: ignore[arg-type]
            making.add_done_callback(lambda task, k=key, e=entry: self._made(k, e, task))
            self._entries[key] = entry
        if entry.idle is not None:
            entry.idle.cancel()
            entry.idle = None
        entry.holders += 1
        return GroupLease(self, key, entry, created)  # type: ignore[arg-type]

    def _made(self, key: Hashable, entry: _Entry[object], task: asyncio.Task[object]) -> None:
        if task.cancelled() or task.exception() is not None:
            # Not kept: the members waiting see the failure; a later member tries again.
            if self._entries.get(key) is entry:
                del self._entries[key]
        elif entry.holders == 0:
            self._schedule(key, entry)

    def _leave(self, key: Hashable, entry: _Entry[object]) -> None:
        entry.holders -= 1
        if entry.holders or self._entries.get(key) is not entry:
            return
        if entry.making.done():
            self._schedule(key, entry)
        else:
            # Every member left before it was made (cancelled, disconnected): nobody waits for it, and a
            # template nobody holds must not be made (nor kept) outside the sessions' capacity.
            del self._entries[key]
            entry.making.cancel()
            self._start_release(entry)

    def _schedule(self, key: Hashable, entry: _Entry[object]) -> None:
        if self._closed or entry.idle is not None:
            return
        loop = asyncio.get_running_loop()
        entry.idle = loop.call_later(self.idle_s, self._expire, key, entry)

    def _expire(self, key: Hashable, entry: _Entry[object]) -> None:
        entry.idle = None
        if entry.holders or self._entries.get(key) is not entry:
            return
        del self._entries[key]
        self._start_release(entry)

    def _start_release(self, entry: _Entry[object]) -> None:
        task = asyncio.ensure_future(_release(entry))
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    async def drain(self) -> None:
        """Wait for the releases under way (tests, and `aclose`)."""
        while self._releasing:
            await asyncio.wait(set(self._releasing))

    async def aclose(self) -> None:
        """Release every group's value now, members or not (the registry's owner is going away: its
        backends' sandboxes are being closed too); a value still being made is cancelled first."""
        self._closed = True
        entries, self._entries = list(self._entries.values()), {}
        for entry in entries:
            if entry.idle is not None:
                entry.idle.cancel()
            if not entry.making.done():
                entry.making.cancel()
            self._start_release(entry)
        await shielded(self.drain())


async def _release(entry: _Entry[object]) -> None:
    """Wait for `entry`'s value to be made (or fail) and release it; never raises."""
    await asyncio.wait([entry.making])
    if entry.making.cancelled() or entry.making.exception() is not None:
        return
    try:
        await shielded(entry.release(entry.making.result()))
    except Exception:  # noqa: BLE001 - a template that cannot be released is the reaper's; the server goes on
        log.exception("releasing a group's template failed")
