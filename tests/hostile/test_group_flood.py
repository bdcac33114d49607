"""Hostile: a flood of one-shot groups through a live server (issue 42 item 3). Three clients run rollouts whose
`group_id` is never reused, each set up once (8 MiB written into its template's RAM-backed root), as fast as
the server takes them; then a well-behaved client runs its own group. On `main` every template was kept
`GROUP_IDLE_S` (600 s here) after its only member, each holding a host uid: the 24-uid pool ran dry and the
flood, then the other client, got `infra_error: no free sandbox uid`, while the templates' tmpfs roots held
memory outside every budget. Now: every rollout scores, the other client's group scores 1.0, the server's
templates never exceed `GROUP_MAX_TEMPLATES` and the host memory their roots hold stays within
`GROUP_TEMPLATE_BUDGET_MB` (measured on the host, from the mount table), `/health` answers throughout, and the
server reports its templates on `/metrics`. Local backend (root, bubblewrap, tmpfs roots, overlay forks)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from coding_agent_env.client import CodingAgentEnv
from coding_agent_env.models import RolloutResult
from tests.groups.test_group_bounds import tmpfs_bytes
from tests.hostile.server import HealthProbe, HostileServer

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="forking local sandboxes needs a root server")

_MIB = 1 << 20
BLOB_MB = 8
CLIENTS = 3
PER_CLIENT = 10
MAX_TEMPLATES = 4
BUDGET_MB = 4 * BLOB_MB
HEALTH_WORST_S = 1.0
SLACK_MB = 4
"""Beyond the setups' blobs: what the sandboxes' own files (answers, logs, tags) hold."""


@pytest.fixture(scope="module")
def server() -> Iterator[HostileServer]:
    parent = Path(tempfile.mkdtemp(prefix="cae-flood-"))
    os.chmod(parent, 0o711)
    state = parent / "state"
    state.mkdir(mode=0o711)
    live = HostileServer(state, settings={
        "SANDBOX_UID_COUNT": "24", "GROUP_IDLE_S": "600", "GROUP_MAX_TEMPLATES": str(MAX_TEMPLATES),
        "GROUP_TEMPLATE_BUDGET_MB": str(BUDGET_MB),
    })
    try:
        yield live
    finally:
        stopped = live.stop()
        subprocess.run(["rm", "-rf", "--one-file-system", str(parent)], check=False)
        assert stopped, f"the server ignored SIGTERM: {live.log_text()[-2000:]}"


def request(group: str, tag: str) -> dict[str, Any]:
    return {
        "instruction": "flood", "agent": "oracle", "sandbox": "local", "group_id": group,
        "setup": [f"head -c {BLOB_MB * _MIB} /dev/urandom > blob && echo {tag} > tag"],
        "solution": ["cp tag answer"], "verify": [f"test $(cat answer) = {tag}", "test -s blob"],
    }


async def client(server: HostileServer, name: str, count: int, peak: dict[str, int]) -> list[RolloutResult]:
    """One client's session running `count` one-shot groups in turn, noting the host memory templates hold."""
    results = []
    async with CodingAgentEnv(server.http) as env:
        await env.reset()
        for i in range(count):
            results.append(await env.run_rollout(**request(f"{name}-{i}", f"{name}{i}")))
            peak["bytes"] = max(peak["bytes"], tmpfs_bytes(server.state_dir))
    return results


def gauge(text: str, name: str) -> float:
    """The sum of a gauge's samples in a Prometheus text exposition."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


async def test_a_flood_of_one_shot_groups_leaves_other_clients_and_host_memory_alone(server: HostileServer) -> None:
    peak = {"bytes": 0}
    with HealthProbe(server.http) as probe:
        flooded = await asyncio.wait_for(
            asyncio.gather(*(client(server, f"flood{c}", PER_CLIENT, peak) for c in range(CLIENTS))), timeout=600)
        mine = await asyncio.wait_for(client(server, "mine", 1, peak), timeout=300)
    results = [r for batch in flooded for r in batch]
    assert [r.status for r in results] == ["completed"] * CLIENTS * PER_CLIENT, [r.error for r in results]
    assert all(r.reward == 1.0 for r in results)
    assert mine[0].status == "completed" and mine[0].reward == 1.0, mine[0].error
    assert not [r for r in (*results, *mine) if r.error and "no free sandbox" in r.error.message]
    # While it ran: the templates' budget, and at most one new template or per-member setup per client over it.
    assert peak["bytes"] <= (BUDGET_MB + CLIENTS * BLOB_MB + SLACK_MB) * _MIB, peak["bytes"] / _MIB
    # What is left once every member ended: the idle templates, within their bounds (RAM on the host).
    assert tmpfs_bytes(server.state_dir) <= BUDGET_MB * _MIB
    metrics = httpx.get(f"{server.http}/metrics", timeout=30).text
    assert 1 <= gauge(metrics, "coding_agent_env_group_templates{") <= MAX_TEMPLATES
    assert BLOB_MB * _MIB <= gauge(metrics, "coding_agent_env_group_template_bytes") <= BUDGET_MB * _MIB
    assert not probe.failures and probe.worst_s < HEALTH_WORST_S, (probe.worst_s, probe.failures[:3])
