"""`limits_hit` from what really happened (issue 27): a fork bomb that ran out of pids and ended before anyone
looked, a disk filled and emptied again, `/dev/shm` inside the disk budget; on the local backend as root (a
control group and a tmpfs root per sandbox), with small limits, one real sandbox each."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from coding_agent_env.sandbox import Sandbox, SandboxSpec
from coding_agent_env.sandbox.base import SandboxLimits

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="sandbox-wide limits on the local backend need root"),
              pytest.mark.usefixtures("assert_no_leftovers")]

LIMITS = SandboxLimits(memory_mb=512, disk_mb=64, max_processes=32, cpus=0, max_file_mb=1024, cpu_s=60)


@pytest.fixture
async def box(make_backend: Callable[[str], Any]) -> AsyncIterator[Sandbox]:
    made = await make_backend("local")().create(SandboxSpec(rollout_id="limits", limits=LIMITS))
    assert made.limit_scopes.get("disk") == "sandbox", "no tmpfs root here"
    try:
        yield made
    finally:
        await made.close()


async def sh(box: Sandbox, script: str, **kw: Any) -> tuple[int | None, str]:
    done = await box.exec([box.shell, "-c", script], timeout=60, max_output_bytes=64 * 1024, **kw)
    return done.exit_code, (done.stdout + done.stderr).decode(errors="replace")


async def test_a_fork_bomb_that_already_ended_is_reported(box: Sandbox) -> None:
    code, out = await sh(box, "bomb() { bomb | bomb & }; bomb 2>/dev/null; sleep 1; kill -9 -1 2>/dev/null; exit 0")
    assert not (await sh(box, "true"))[0]  # the bomb is over: the sandbox runs commands again
    assert any("process limit" in hit for hit in await box.limits_hit()), out[-500:]
    await box.close()
    assert any("process limit" in hit for hit in await box.limits_hit())  # the counters, read before removal


async def test_a_quiet_sandbox_hits_nothing(box: Sandbox) -> None:
    assert (await sh(box, "head -c 8M /dev/zero > f && head -c 8M /dev/zero > /dev/shm/g && rm f /dev/shm/g"))[0] == 0
    assert await box.limits_hit() == []
    await box.close()
    assert await box.limits_hit() == []


@pytest.mark.parametrize("full_for", ["sleep 0.3", "true"], ids=["a-while", "an-instant"])
async def test_a_disk_filled_then_emptied_is_reported(box: Sandbox, full_for: str) -> None:
    # Full, then empty again within the same command: only a mark taken while it ran can tell.
    code, out = await sh(box, f"dd if=/dev/zero of=fill bs=1M count=100 2>/dev/null; {full_for}; rm -f fill")
    assert code == 0, out
    assert any("disk quota exceeded" in hit for hit in await box.limits_hit()), out


async def test_dev_shm_is_inside_the_disk_budget(box: Sandbox) -> None:
    code, out = await sh(box, "head -c 40M /dev/zero > /dev/shm/a && head -c 40M /dev/zero > b")
    assert code != 0 and "No space left" in out, out
    code, out = await sh(box, "rm -f b /dev/shm/a && head -c 100M /dev/zero > /dev/shm/c")
    assert code != 0 and "No space left" in out, out
    assert any("disk quota exceeded" in hit for hit in await box.limits_hit())


async def test_dev_shm_is_shared_by_commands_and_private_to_fresh_ones(box: Sandbox) -> None:
    assert (await sh(box, "echo left > /dev/shm/planted"))[0] == 0
    assert (await sh(box, "cat /dev/shm/planted"))[1] == "left\n"
    code, out = await sh(box, "ls -A /dev/shm; echo fresh > /dev/shm/mine", fresh=True)
    assert code == 0 and out == "", out  # verify's /dev/shm: nothing the agent left
    assert (await sh(box, "ls -A /dev/shm"))[1] == "planted\n"  # and nothing of the fresh one stays


async def test_an_agents_log_survives_the_disk_it_filled(box: Sandbox) -> None:
    log = f"{box.paths.logs}/agent/agent.log"
    # More than the page the log already has after the disk filled: only room set aside for the log holds it.
    script = ("echo before; head -c 100M /dev/zero > fill; head -c 65536 /dev/zero | tr '\\0' x; "
              "echo; echo 'after the disk filled'; exit 0")
    agent = await box.spawn([box.shell, "-c", script], log_path=log)
    assert await agent.wait() == 0
    text = await box.read_text(log, max_bytes=1 << 20, tail=True)
    assert text.startswith("before") and "No space left" in text, text[:300]
    assert text.endswith("x" * 65536 + "\nafter the disk filled\n"), text[-300:]


async def test_a_docker_fork_bomb_is_still_reported_after_close(make_backend: Callable[[str], Any]) -> None:
    box = await make_backend("docker")().create(SandboxSpec(rollout_id="limits", limits=LIMITS))
    try:
        code, out = await sh(box, "bomb() { bomb | bomb & }; bomb 2>/dev/null; sleep 1; kill -9 -1 2>/dev/null; "
                                  "exit 0")
    finally:
        await box.close()
    assert any("process limit" in hit for hit in await box.limits_hit()), out[-500:]


@pytest.mark.parametrize("full_for", ["sleep 0.3", "true"], ids=["a-while", "an-instant"])
async def test_a_docker_workdir_filled_then_emptied_is_reported(make_backend: Callable[[str], Any],
                                                               full_for: str) -> None:
    box = await make_backend("docker")().create(SandboxSpec(rollout_id="limits", limits=LIMITS))
    try:
        code, out = await sh(box, f"dd if=/dev/zero of=fill bs=1M count=100 2>/dev/null; {full_for}; rm -f fill")
        assert code == 0, out
        assert any("disk quota exceeded" in hit for hit in await box.limits_hit()), out
    finally:
        await box.close()
