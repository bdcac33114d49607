"""`GroupTemplates`: one value per group made once, shared, released after the last member and the idle time,
made anew after a failure, released at close; a first member's cancellation does not cancel the making."""

from __future__ import annotations

import asyncio

import pytest

from coding_agent_env.sandbox.templates import GroupTemplates
from tests.helpers import poll


class Maker:
    """Counts what it makes and releases; `gate` holds the making until set."""

    def __init__(self, fail: bool = False) -> None:
        self.made: list[str] = []
        self.released: list[str] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail = fail

    async def make(self) -> str:
        await self.gate.wait()
        if self.fail:
            raise RuntimeError("setup machinery broke")
        self.made.append(f"t{len(self.made)}")
        return self.made[-1]

    async def release(self, value: str) -> None:
        self.released.append(value)


async def test_members_share_one_value_released_after_the_last_leaves_and_the_idle_time() -> None:
    registry, maker = GroupTemplates(idle_s=0.05), Maker()
    maker.gate.clear()
    leases = [registry.join("g", maker.make, maker.release) for _ in range(3)]
    assert [lease.created for lease in leases] == [True, False, False]
    maker.gate.set()
    assert {await lease.value() for lease in leases} == {"t0"} and maker.made == ["t0"]
    for lease in leases[:2]:
        lease.leave()
        lease.leave()  # idempotent
    later = registry.join("g", maker.make, maker.release)  # while one member still holds it
    assert not later.created and await later.value() == "t0"
    leases[2].leave()
    later.leave()
    await poll(lambda: maker.released == ["t0"], "the release after the idle time")
    assert len(registry) == 0
    again = registry.join("g", maker.make, maker.release)
    assert again.created and await again.value() == "t1"
    again.leave()
    await registry.aclose()
    assert maker.released == ["t0", "t1"]


async def test_a_member_rejoining_within_the_idle_time_keeps_the_value() -> None:
    registry, maker = GroupTemplates(idle_s=0.3), Maker()
    first = registry.join("g", maker.make, maker.release)
    await first.value()
    first.leave()
    second = registry.join("g", maker.make, maker.release)
    assert await second.value() == "t0" and maker.released == []
    second.leave()
    await registry.aclose()
    assert maker.made == ["t0"] and maker.released == ["t0"]


async def test_a_failure_reaches_every_waiting_member_and_is_not_kept() -> None:
    registry, maker = GroupTemplates(idle_s=10), Maker(fail=True)
    maker.gate.clear()
    leases = [registry.join("g", maker.make, maker.release) for _ in range(2)]
    maker.gate.set()
    for lease in leases:
        with pytest.raises(RuntimeError, match="machinery broke"):
            await lease.value()
        lease.leave()
    maker.fail = False
    retry = registry.join("g", maker.make, maker.release)
    assert retry.created and await retry.value() == "t0"
    retry.leave()
    await registry.aclose()
    assert maker.released == ["t0"]


async def test_the_first_members_cancellation_does_not_cancel_the_making() -> None:
    registry, maker = GroupTemplates(idle_s=10), Maker()
    maker.gate.clear()
    first = registry.join("g", maker.make, maker.release)
    waiting = asyncio.ensure_future(first.value())
    await asyncio.sleep(0)
    other = registry.join("g", maker.make, maker.release)  # a second member waits for the same making
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    first.leave()
    maker.gate.set()
    assert await other.value() == "t0"
    other.leave()
    await registry.aclose()
    assert maker.released == ["t0"]


async def test_close_releases_held_values_and_cancels_one_being_made() -> None:
    registry, maker = GroupTemplates(idle_s=10), Maker()
    held = registry.join("a", maker.make, maker.release)
    await held.value()
    maker.gate.clear()
    making = registry.join("b", maker.make, maker.release)
    await registry.aclose()
    assert maker.released == ["t0"] and maker.made == ["t0"]
    with pytest.raises(asyncio.CancelledError):
        await making.value()
    with pytest.raises(RuntimeError, match="closed"):
        registry.join("c", maker.make, maker.release)
    held.leave()
    making.leave()
    assert maker.released == ["t0"]


async def test_a_making_every_member_left_is_cancelled_and_never_kept() -> None:
    registry, maker = GroupTemplates(idle_s=10), Maker()
    maker.gate.clear()
    leases = [registry.join(f"g{i}", maker.make, maker.release) for i in range(3)]
    for lease in leases:
        lease.leave()
    assert len(registry) == 0
    await registry.drain()
    maker.gate.set()
    assert all(lease.entry.making.cancelled() for lease in leases)
    assert maker.made == [] and maker.released == []
    await registry.aclose()
