"""`GroupTemplates`: each group's set-up state, made once by its first member and shared by all of them, bounded.

A group (rollouts or episodes that start from the same task, as GRPO runs a task G times) is keyed by its
`group_id` and everything its sandbox and setup depend on (the caller's key). The first member to `join` starts
making the group's value (a backend's `SandboxTemplate` and the setup's results, or the setup's failure): in a
task of its own, under the caller's deadline, so a first member cancelled or crashed does not take the others'
setup with it. Every member awaits the same value; an exception while making it reaches every member waiting
and is not kept (the next member to join makes it anew).

Bounds (`TemplateBounds`, from the settings; INTEGRITY 41): values held at once (being made, in use or idle) on
this registry (`max_templates`: each local template holds a host uid and a RAM-backed tmpfs) and per caller
(`max_templates_per_caller`: the caller that started making it, a session; None is no caller: only the server's
bound counts), and the bytes they hold (`template_budget_mb`, what `size` says of each once made). A join that
would start a value beyond a bound first evicts idle values, least recently used first (the caller's own when
its own bound is reached), and when none is idle raises `TemplateBoundError` saying which bound: nothing was
started, and the member sets up on its own (`workspace.lifecycle` reports `per_member` and why). A value made
while the bytes are over budget, when no idle one can go, is not kept: released as soon as its last member
leaves. Joining a value that exists is never refused (a member costs what any sandbox costs).

Lifetime: members `leave` (each once). The value is released once no member holds it and none joined for
`idle_s` (members of a group may run a few at a time); at once when the group's `members` (its size, when a
member said it) have all joined and left, when it is evicted, or when `aclose` ends the registry; a value still
being made when its last member leaves is cancelled (its making cleans up after itself); what is released is
the caller's `release(value)`, called once, shielded. Only the event loop's thread uses a registry.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from coding_agent_env.aio import shielded
from coding_agent_env.settings import SettingsSection

__all__ = ["GroupLease", "GroupTemplates", "TemplateBoundError", "TemplateBounds", "TemplateCounts"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_MIB = 1 << 20


@dataclass(frozen=True)
class TemplateBounds(SettingsSection):
    """What a registry's values may hold (see the module docstring); each from `Settings.group_<name>`."""

    PREFIX = "group_"

    max_templates: int
    max_templates_per_caller: int
    template_budget_mb: int
    idle_s: float


@dataclass(frozen=True)
class TemplateCounts:
    """What a registry holds now: values (`held`), of which `idle`, and the bytes they hold."""

    held: int
    idle: int
    bytes: int


class TemplateBoundError(Exception):
    """A group's value would go beyond a bound of the registry (`str()` says which); nothing was started."""


@dataclass(eq=False)
class _Entry(Generic[T]):
    key: Hashable
    making: asyncio.Task[T]
    release: Callable[[T], Awaitable[None]]
    caller: str | None
    members: int | None
    holders: int = 0
    joined: int = 0
    size: int = 0
    kept: bool = True
    last_used: float = 0.0
    idle: asyncio.TimerHandle | None = None

    @property
    def is_idle(self) -> bool:
        """Made, and no member holds it: it may be evicted."""
        return self.holders == 0 and self.making.done()


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


def _no_size(_value: object) -> int:
    return 0


class GroupTemplates:
    """See the module docstring. `bounds`: None bounds only the idle time (`idle_s`)."""

    def __init__(self, bounds: TemplateBounds | None = None, *, idle_s: float = 30.0) -> None:
        self.bounds = bounds
        self.idle_s = bounds.idle_s if bounds is not None else idle_s
        self._entries: dict[Hashable, _Entry[object]] = {}
        self._releasing: set[asyncio.Task[None]] = set()
        self._closed = False

    def __len__(self) -> int:
        """Groups whose value is held (being made, in use or idle)."""
        return len(self._entries)

    def counts(self) -> TemplateCounts:
        entries = self._entries.values()
        return TemplateCounts(len(self._entries), sum(1 for e in entries if e.is_idle), sum(e.size for e in entries))

    def join(
        self,
        key: Hashable,
        make: Callable[[], Awaitable[T]],
        release: Callable[[T], Awaitable[None]],
        *,
        caller: str | None = None,
        size: Callable[[T], int] = _no_size,
        members: int | None = None,
    ) -> GroupLease[T]:
        """Hold group `key`'s value, starting `make()` when no live one exists (`release` then frees what it
        makes, `size` says how many bytes it holds once made; `caller` and `members`: see the module
        docstring). A group whose making failed is made anew by the next join. `TemplateBoundError` when a new
        value would go beyond a bound."""
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
            refusal = self._make_room(caller)
            if refusal is not None:
                raise TemplateBoundError(refusal)
            making: asyncio.Task[T] = asyncio.ensure_future(make())  # type: ignore[assignment]
            entry = _Entry(key, making, release, caller, members)  # type: ignore[arg-type]
            making.add_done_callback(lambda task, e=entry, s=size: self._made(e, task, s))
            self._entries[key] = entry
        if entry.idle is not None:
            entry.idle.cancel()
            entry.idle = None
        entry.holders += 1
        entry.joined += 1
        return GroupLease(self, key, entry, created)  # type: ignore[arg-type]

    # -- bounds ------------------------------------------------------------------------------------------

    def _over(self, caller: str | None) -> tuple[str, str | None] | None:
        """The first bound a new value of `caller` would go beyond, and whose idle values may go to make room
        (a caller's, or anyone's: None); None when it fits."""
        bounds = self.bounds
        if bounds is None:
            return None
        if len(self._entries) >= bounds.max_templates:
            return f"the server holds its most group templates ({bounds.max_templates}, GROUP_MAX_TEMPLATES)", None
        if caller is not None:
            mine = sum(1 for entry in self._entries.values() if entry.caller == caller)
            if mine >= bounds.max_templates_per_caller:
                return (f"this session holds its most group templates ({bounds.max_templates_per_caller}, "
                        "GROUP_MAX_TEMPLATES_PER_CALLER)", caller)
        held = sum(entry.size for entry in self._entries.values())
        if held >= bounds.template_budget_mb * _MIB:
            return (f"group templates hold {held // _MIB} MiB, their budget is {bounds.template_budget_mb} MiB "
                    "(GROUP_TEMPLATE_BUDGET_MB)", None)
        return None

    def _make_room(self, caller: str | None) -> str | None:
        """Evict idle values, least recently used first, until a new value of `caller` fits; why it cannot."""
        while True:
            over = self._over(caller)
            if over is None:
                return None
            reason, whose = over
            if not self._evict_one(whose):
                return f"group templates at their bound: {reason}; none is idle"

    def _evict_one(self, caller: str | None, *, sparing: _Entry[object] | None = None) -> bool:
        """Release the least recently used idle value (of `caller`, when given); whether there was one."""
        idle = [entry for entry in self._entries.values()
                if entry.is_idle and entry is not sparing and (caller is None or entry.caller == caller)]
        if not idle:
            return False
        victim = min(idle, key=lambda entry: entry.last_used)
        log.info("group template %r evicted (least recently used, idle) to make room", victim.key)
        self._drop(victim)
        return True

    def _drop(self, entry: _Entry[object]) -> None:
        """Forget `entry` and release its value (no member holds it)."""
        if entry.idle is not None:
            entry.idle.cancel()
            entry.idle = None
        if self._entries.get(entry.key) is entry:
            del self._entries[entry.key]
        self._start_release(entry)

    # -- lifetime ----------------------------------------------------------------------------------------

    def _made(self, entry: _Entry[object], task: asyncio.Task[object], size: Callable[[object], int]) -> None:
        if task.cancelled() or task.exception() is not None:
            # Not kept: the members waiting see the failure; a later member tries again.
            if self._entries.get(entry.key) is entry:
                del self._entries[entry.key]
            return
        try:
            entry.size = max(0, int(size(task.result())))
        except Exception:  # noqa: BLE001 - an unmeasured value is charged nothing, and said
            log.exception("measuring group template %r failed", entry.key)
        self._fit_budget(entry)
        if entry.holders == 0:
            self._idle(entry)

    def _fit_budget(self, entry: _Entry[object]) -> None:
        """With `entry` made: evict idle values until the bytes fit the budget; if they cannot, `entry` is not
        kept past its members."""
        if self.bounds is None:
            return
        budget = self.bounds.template_budget_mb * _MIB
        while sum(e.size for e in self._entries.values()) > budget:
            if not self._evict_one(None, sparing=entry):
                entry.kept = False
                log.info("group template %r is over the budget: released once its members leave", entry.key)
                return

    def _leave(self, key: Hashable, entry: _Entry[object]) -> None:
        entry.holders -= 1
        entry.last_used = asyncio.get_running_loop().time()
        if entry.holders or self._entries.get(key) is not entry:
            return
        if entry.making.done():
            self._idle(entry)
        else:
            # Every member left before it was made (cancelled, disconnected): nobody waits for it, and a
            # template nobody holds must not be made (nor kept) outside the sessions' capacity.
            del self._entries[key]
            entry.making.cancel()
            self._start_release(entry)

    def _idle(self, entry: _Entry[object]) -> None:
        """No member holds `entry` (made): released now when none can come or it is not kept, else later."""
        if self._closed or entry.idle is not None or self._entries.get(entry.key) is not entry:
            return
        complete = entry.members is not None and entry.joined >= entry.members
        if complete or not entry.kept:
            self._drop(entry)
            return
        loop = asyncio.get_running_loop()
        entry.idle = loop.call_later(self.idle_s, self._expire, entry)

    def _expire(self, entry: _Entry[object]) -> None:
        entry.idle = None
        if entry.holders or self._entries.get(entry.key) is not entry:
            return
        self._drop(entry)

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
