"""Limits that hold under abuse (INTEGRITY 30): disk, memory, processes and CPU bounded for a whole sandbox, on
the local backend (as root: a control group and a tmpfs root per sandbox) and on Docker (the container's
limits; its workdir a tmpfs volume of the disk budget). Each abuse is an `oracle` rollout with small limits
asked for in the request; beside it the example task runs normally, and nothing is left afterwards.

Bounded for a 2-core, 24 GiB machine: at most 512 MB written, 2 GiB asked for by eight processes against a
1 GiB sandbox, 64 processes, half a core for two seconds.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from coding_agent_env.cli.main import load_task
from coding_agent_env.models import LimitsRequest, RolloutRequest, RolloutResult, RolloutStatus
from coding_agent_env.rollout import run_rollout
from coding_agent_env.workspace.limits import LimitsError
from tests.backends.conftest import Target

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "binary_search.yaml"
KINDS = ["local", "docker"]

pytestmark = [pytest.mark.usefixtures("assert_no_leftovers"), pytest.mark.slow]


def _root_only(kind: str) -> None:
    if kind == "local" and os.geteuid() != 0:
        pytest.skip("sandbox-wide limits on the local backend need root (see test_unprivileged for the rest)")


async def _beside(target: Target, abuse: RolloutRequest) -> RolloutResult:
    """Run `abuse` and, beside it, the example task: that one must complete normally."""
    name, settings, backends = target
    example = load_task(str(EXAMPLE)).model_copy(update={"sandbox": name})
    hit, normal = await asyncio.gather(
        run_rollout(abuse.model_copy(update={"sandbox": name}), settings=settings, backends=backends),
        run_rollout(example, settings=settings, backends=backends),
    )
    assert normal.status is RolloutStatus.COMPLETED and normal.reward == 1.0, (normal.error, normal.limits_hit)
    assert not normal.limits_hit
    return hit


def _abuse(solution: list[str], verify: list[str], **limits: float) -> RolloutRequest:
    return RolloutRequest(instruction="abuse the sandbox", agent="oracle", solution=solution, verify=verify,
                          limits=LimitsRequest(**limits), command_timeout_s=60, agent_timeout_s=60)


@pytest.mark.parametrize("kind", KINDS)
async def test_writing_past_the_disk_budget_is_stopped_near_it(kind: str, backend_for: Callable[..., Target]) -> None:
    _root_only(kind)
    write = "for i in $(seq 80); do head -c 10M /dev/zero > f$i || exit 3; done"
    result = await _beside(backend_for(kind), _abuse([write], ["test $(du -sm . | cut -f1) -le 512"], disk_mb=512))
    assert result.status is RolloutStatus.AGENT_FAILED and result.agent_exit_code == 3, result.error
    assert result.reward == 1.0  # what was written stays within the budget
    assert any("disk quota exceeded" in hit for hit in result.limits_hit), result.limits_hit
    assert result.limits["disk"] == 512 << 20
    assert result.limit_scopes["disk"] == ("sandbox" if kind == "local" else "workdir")


_HOG = ("python3 -c \"import time; x = bytearray({mb} << 20); x[::4096] = b'x' * len(x[::4096]); time.sleep(3); "
        "open('alive-{n}', 'w').close()\"")


@pytest.mark.parametrize("kind", KINDS)
async def test_eight_processes_do_not_fit_a_sandbox_made_for_four(kind: str,
                                                                  backend_for: Callable[..., Target]) -> None:
    _root_only(kind)
    hogs = " & ".join(_HOG.format(mb=256, n=n) for n in range(8)) + " & wait"
    result = await _beside(backend_for(kind), _abuse([hogs], ["test $(ls alive-* | wc -l) -lt 8"],
                                                     memory_mb=1024, disk_mb=64))
    assert result.reward == 1.0, (result.verify_results, result.limits_hit)
    assert any("out of memory" in hit for hit in result.limits_hit), result.limits_hit
    assert result.limit_scopes["memory"] == "sandbox" and result.limits["memory"] == (1024 + 64) << 20
    one = await _beside(backend_for(kind), _abuse([_HOG.format(mb=256, n=0)], ["test -e alive-0"],
                                                  memory_mb=1024, disk_mb=64))
    assert one.status is RolloutStatus.COMPLETED and one.reward == 1.0 and not one.limits_hit


@pytest.mark.parametrize("kind", KINDS)
async def test_a_fork_bomb_hits_the_process_limit(kind: str, backend_for: Callable[..., Target]) -> None:
    _root_only(kind)
    bomb = "bomb() { bomb | bomb & }; bomb; sleep 3; exit 0"
    result = await _beside(backend_for(kind), _abuse([bomb], [], max_processes=64))
    assert result.status in (RolloutStatus.COMPLETED, RolloutStatus.AGENT_FAILED), result.error
    assert any("process limit" in hit for hit in result.limits_hit), result.limits_hit
    assert result.limits["pids"] == 64 and result.limit_scopes["pids"] == "sandbox"


_BURN = ("python3 -c \"import os, time; end = time.monotonic() + 2\nwhile time.monotonic() < end: pass\n"
         "t = os.times(); print(t.user + t.system)\" > used.txt")


@pytest.mark.parametrize("kind", KINDS)
async def test_a_cpu_burner_gets_about_the_share_asked_for(kind: str, backend_for: Callable[..., Target]) -> None:
    _root_only(kind)
    # Two seconds of wall time at half a core: about one second of CPU; never much more (a loaded machine may
    # give it less).
    result = await _beside(backend_for(kind), _abuse([_BURN], ["python3 -c \"import sys; used = float(open("
                                                               "'used.txt').read()); sys.exit(not 0.1 < used < 1.3)\""],
                                                     cpus=0.5))
    assert result.reward == 1.0, (result.files.get("used.txt"), result.verify_results)
    assert result.limits["nano_cpus"] == 500_000_000 and result.limit_scopes["nano_cpus"] == "sandbox"


async def test_a_request_over_the_servers_caps_is_refused(backend_for: Callable[..., Target]) -> None:
    name, settings, backends = backend_for("local", sandbox_memory_mb=2048)
    task = _abuse(["true"], [], memory_mb=4096).model_copy(update={"sandbox": name})
    with pytest.raises(LimitsError, match=r"limits.memory_mb 4096 is over this server's cap of 2048 "
                                          r"\(SANDBOX_MEMORY_MB\)"):
        await run_rollout(task, settings=settings, backends=backends)
