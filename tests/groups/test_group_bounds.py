"""Group templates are bounded (INTEGRITY 41; issue 42 item 3), measured as an attack: a flood of rollouts, each of
a group of its own (`group_id`s never reused), set up once and never joined again. On `main` every template was
kept `GROUP_IDLE_S` after its only member: their RAM-backed tmpfs roots added up outside every budget, each held
a host uid, and once the pool was empty every rollout on the server, another client's too, failed with
`infra_error: no free sandbox uid`. Here: at most `GROUP_MAX_TEMPLATES` held and their bytes within
`GROUP_TEMPLATE_BUDGET_MB` (measured on the host, from the mount table: the tmpfs roots left mounted), the other
client's group runs to its reward, and nothing is left once the server is gone. Real local sandboxes (root,
bubblewrap, tmpfs roots, overlay forks)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from coding_agent_env.models import RolloutRequest, RolloutResult, RolloutStatus
from coding_agent_env.rollout import run_rollout
from coding_agent_env.sandbox import Backends
from coding_agent_env.settings import Settings
from tests.helpers import leftovers, poll, wait_until

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="forking local sandboxes needs a root server")

_MIB = 1 << 20
BLOB_MB = 8
"""What each flooding group's setup writes (into its template's tmpfs, that is RAM)."""
FLOOD = 20
FLOOD_AT_ONCE = 5
MAX_TEMPLATES = 4
BUDGET_MB = 3 * BLOB_MB


def request(group: str, tag: str) -> RolloutRequest:
    return RolloutRequest.model_validate({
        "instruction": "flood", "agent": "oracle", "group_id": group,
        "setup": [f"head -c {BLOB_MB * _MIB} /dev/urandom > blob && echo {tag} > tag"],
        "solution": ["cp tag answer"], "verify": [f"test $(cat answer) = {tag}", "test -s blob"],
    })


def tmpfs_bytes(state_dir: Path) -> int:
    """Bytes in use on the tmpfs mounts under `state_dir` (the sandboxes' and templates' roots), from the host."""
    total, prefix = 0, os.path.realpath(state_dir) + "/"
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] == "tmpfs" and fields[1].startswith(prefix):
            path = fields[1].replace("\\040", " ")
            try:
                st = os.statvfs(path)
            except FileNotFoundError:  # released since the mount table was read
                continue
            # Still mounted after the measure: else (a template released meanwhile) it measured the disk below.
            if os.path.ismount(path):
                total += (st.f_blocks - st.f_bfree) * st.f_frsize
    return total


@pytest.fixture
def bounded(settings: Settings) -> Iterator[Settings]:
    local = settings.backends[0].model_copy(update={"uid_count": 16})
    yield settings.model_copy(update={
        "backends": (local,), "group_idle_s": 600.0, "group_max_templates": MAX_TEMPLATES,
        "group_max_templates_per_caller": 2, "group_template_budget_mb": BUDGET_MB,
    })
    wait_until(lambda: not leftovers(settings), lambda: f"left behind: {leftovers(settings)}")


async def test_a_flood_of_one_shot_groups_is_bounded_and_other_clients_are_unaffected(bounded: Settings) -> None:
    peak = {"templates": 0, "bytes": 0}
    async with Backends(bounded) as backends:
        gate = asyncio.Semaphore(FLOOD_AT_ONCE)

        async def flood(i: int) -> RolloutResult:
            async with gate:  # each of a caller of its own: the server's bound must hold, not the callers'
                result = await run_rollout(request(f"flood-{i}", f"f{i}"), backends=backends, caller=f"flood-{i % 5}")
            peak["templates"] = max(peak["templates"], len(backends.templates))
            peak["bytes"] = max(peak["bytes"], backends.templates.counts().bytes)
            return result

        flooding = [asyncio.ensure_future(flood(i)) for i in range(FLOOD)]
        # The other client comes once the flood has had time to fill the uid pool (16) with idle templates.
        await poll(lambda: sum(task.done() for task in flooding) >= FLOOD - FLOOD_AT_ONCE, "most of the flood",
                   timeout_s=300)
        others = await asyncio.gather(*(run_rollout(request("mine", "m"), backends=backends, caller="other")
                                        for _ in range(3)))
        flooded = await asyncio.gather(*flooding)
        after = tmpfs_bytes(bounded.state_dir)
        counts = backends.templates.counts()

        # The other client: every member ran and scored as if alone.
        assert [r.status for r in others] == [RolloutStatus.COMPLETED] * 3, [r.error for r in others]
        assert [r.reward for r in others] == [1.0] * 3
        # The flood itself: every rollout ran (forked, or set up on its own past the bound, saying so).
        assert [r.status for r in flooded] == [RolloutStatus.COMPLETED] * FLOOD, [r.error for r in flooded]
        assert all(r.reward == 1.0 for r in flooded)
        assert not [r for r in (*flooded, *others) if r.error and "no free sandbox" in r.error.message]
        per_member = [r.group for r in flooded if r.group and r.group.setup == "per_member"]
        assert per_member and all("group templates at their bound" in (g.note or "") for g in per_member)
        # Bounded while it ran and after: the templates held, and the memory their tmpfs roots hold on the host.
        assert peak["templates"] <= MAX_TEMPLATES and counts.held <= MAX_TEMPLATES
        assert BLOB_MB * _MIB <= peak["bytes"] and counts.bytes <= BUDGET_MB * _MIB  # measured, and bounded
        assert after <= BUDGET_MB * _MIB, f"{after / _MIB:.0f} MiB of template roots still held"
    assert tmpfs_bytes(bounded.state_dir) == 0  # the server gone: host memory back


async def test_a_group_of_known_size_releases_its_template_as_its_last_member_ends(bounded: Settings) -> None:
    """`group_size`: once that many members have joined and ended, no member can come: the template goes at once,
    not `GROUP_IDLE_S` (600 s here) later."""
    async with Backends(bounded) as backends:
        sized = request("sized", "s").model_copy(update={"group_size": 2})
        results = await asyncio.gather(*(run_rollout(sized, backends=backends, caller="c") for _ in range(2)))
        assert [r.reward for r in results] == [1.0, 1.0]
        assert all(r.group and r.group.setup == "forked" for r in results)
        assert len(backends.templates) == 0
        await backends.templates.drain()
        assert tmpfs_bytes(bounded.state_dir) == 0
