"""`GroupTemplates`: one value per group made once, shared, released after the last member and the idle time,
made anew after a failure, released at close; a first member's cancellation does not cancel the making."""

from __future__ import annotations

import asyncio

import pytest

from coding_agent_env.sandbox.templates import GroupTemplates, TemplateBoundError, TemplateBounds, TemplateCounts
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


# -- bounds (INTEGRITY 41) -------------------------------------------------------------------------------

def bounded(max_templates: int = 8, per_caller: int = 8, budget_mb: int = 1024,
            idle_s: float = 600.0) -> GroupTemplates:
    return GroupTemplates(TemplateBounds(max_templates, per_caller, budget_mb, idle_s))


async def test_the_server_bound_refuses_a_new_group_while_every_template_is_in_use() -> None:
    registry, maker = bounded(max_templates=2), Maker()
    held = [registry.join(g, maker.make, maker.release) for g in ("g1", "g2")]
    with pytest.raises(TemplateBoundError, match="GROUP_MAX_TEMPLATES.*none is idle"):
        registry.join("g3", maker.make, maker.release)
    joined = registry.join("g1", maker.make, maker.release)  # a member of a group held is never refused
    assert await joined.value() == await held[0].value() and len(registry) == 2
    for lease in (*held, joined):
        lease.leave()
    await registry.aclose()


async def test_a_new_group_evicts_the_least_recently_used_idle_template() -> None:
    registry, maker = bounded(max_templates=2), Maker()
    first, second = (registry.join(g, maker.make, maker.release) for g in ("g1", "g2"))
    assert [await first.value(), await second.value()] == ["t0", "t1"]
    first.leave()
    second.leave()
    third = registry.join("g3", maker.make, maker.release)
    assert third.created and await third.value() == "t2"
    await registry.drain()
    assert maker.released == ["t0"] and len(registry) == 2  # g1, used least recently, went at once
    third.leave()
    await registry.aclose()


async def test_one_caller_cannot_take_every_template() -> None:
    registry, maker = bounded(max_templates=4, per_caller=1), Maker()
    mine = registry.join("a1", maker.make, maker.release, caller="a")
    with pytest.raises(TemplateBoundError, match="this session holds its most"):
        registry.join("a2", maker.make, maker.release, caller="a")
    other = registry.join("b1", maker.make, maker.release, caller="b")
    await other.value()
    await mine.value()
    other.leave()
    mine.leave()
    again = registry.join("a2", maker.make, maker.release, caller="a")  # its own idle one goes, not b's
    await again.value()
    await registry.drain()
    assert len(maker.released) == 1 and registry.counts().held == 2
    again.leave()
    await registry.aclose()


async def test_bytes_over_the_budget_evict_idle_templates_and_are_not_kept() -> None:
    mib = 1 << 20
    sizes = {"t0": 600 * 1024, "t1": mib, "t2": 2 * mib}
    registry, maker = bounded(budget_mb=1), Maker()
    first = registry.join("g1", maker.make, maker.release, size=sizes.__getitem__)
    await first.value()
    first.leave()
    second = registry.join("g2", maker.make, maker.release, size=sizes.__getitem__)
    await second.value()
    await registry.drain()
    assert maker.released == ["t0"]  # over the budget together: the idle one went
    assert registry.counts().bytes == sizes["t1"]
    with pytest.raises(TemplateBoundError, match="GROUP_TEMPLATE_BUDGET_MB"):
        registry.join("g3", maker.make, maker.release, size=sizes.__getitem__)  # under the budget only
    second.leave()
    big = registry.join("g3", maker.make, maker.release, size=sizes.__getitem__)  # evicts g2 first
    assert await big.value() == "t2"
    big.leave()  # over the budget alone: not kept past its members
    await poll(lambda: maker.released == ["t0", "t1", "t2"], "the template over the budget released at once")
    assert len(registry) == 0
    await registry.aclose()


async def test_a_group_of_known_size_is_released_once_its_last_member_leaves() -> None:
    registry, maker = bounded(idle_s=600.0), Maker()
    leases = [registry.join("g", maker.make, maker.release, members=2) for _ in range(2)]
    for lease in leases:
        await lease.value()
        lease.leave()
    await poll(lambda: maker.released == ["t0"], "release at once, not after the idle time")
    assert registry.counts() == TemplateCounts(0, 0, 0)
    await registry.aclose()
