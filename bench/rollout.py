"""Oracle rollouts (1 setup, 1 solution, 2 verify commands) at concurrency 1, 8 and 32: rollouts/s, and wall
time against running the same four commands as raw bwrap spawns (same binds, same credentials) in the same run.
Targets: at concurrency 1 within 1.3x of the raw commands; at 32, at least 40 rollouts/s on 2 cores.
Then the clean room's cost: the same task with `b.txt` declared as an artifact (verify in a fresh sandbox)
against verify in the agent's workspace, alternating, at concurrency 1 (target: under 15 ms extra at p50).

Ours and the reference alternate in rounds (one rollout each at concurrency 1, a batch each above), so load
from other work on the machine hits both alike. `cpu` is this process's and its children's CPU time per
rollout: a figure that load elsewhere barely moves (kernel work done in worker threads, such as tearing
down network namespaces, is not in it).

    .venv/bin/python bench/rollout.py [BATCH]   (rollouts per batch at concurrency 8; at 32, at least 128)
"""

from __future__ import annotations

import asyncio
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._common import bench_settings, raw_bwrap_argv, uid_pool_end, which_bwrap  # noqa: E402
from coding_agent_env.models import RolloutRequest, RolloutStatus  # noqa: E402
from coding_agent_env.rollout import run_rollout  # noqa: E402
from coding_agent_env.sandbox import Backends  # noqa: E402
from coding_agent_env.settings import Settings  # noqa: E402

COMMANDS = ["echo 1 > a.txt", "echo 2 > b.txt", "grep -qx 1 a.txt", "grep -qx 2 b.txt"]
REQUEST = RolloutRequest(
    instruction="write b.txt", agent="oracle", setup=[COMMANDS[0]], solution=[COMMANDS[1]], verify=COMMANDS[2:]
)
CLEAN_ROOM_REQUEST = REQUEST.model_copy(
    update={"files": {"a.txt": "1\n"}, "setup": [], "verify": COMMANDS[2:], "artifacts": ["b.txt"]}
)
WORKSPACE_REQUEST = CLEAN_ROOM_REQUEST.model_copy(update={"artifacts": []})


async def raw_commands(uid: int | None) -> None:
    workdir = tempfile.mkdtemp(prefix="cae-bench-raw-")
    os.chmod(workdir, 0o777)
    creds = {"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}
    try:
        for cmd in COMMANDS:
            argv = raw_bwrap_argv(which_bwrap(), workdir) + ["bash", "-c", cmd]
            proc = await asyncio.create_subprocess_exec(*argv, env={"PATH": "/usr/bin:/bin"}, **creds)  # type: ignore[arg-type]
            assert await proc.wait() == 0
    finally:
        shutil.rmtree(workdir)


Job = Callable[[], Awaitable[None]]


def cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


async def batch(concurrency: int, total: int, job: Job) -> tuple[float, float]:
    """(wall seconds, CPU seconds) to run `total` jobs, at most `concurrency` at a time."""
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            await job()

    started, cpu = time.perf_counter(), cpu_s()
    await asyncio.gather(*(one() for _ in range(total)))
    return time.perf_counter() - started, cpu_s() - cpu


async def level(concurrency: int, size: int, rounds: int, ours: Job, raw: Job) -> None:
    """Alternate ours and raw, `rounds` batches of `size` each; print rates, CPU and the ratio of the medians."""
    walls: dict[str, list[float]] = {"ours": [], "raw": []}
    cpus: dict[str, float] = {"ours": 0.0, "raw": 0.0}
    for _ in range(rounds):
        for name, job in (("ours", ours), ("raw", raw)):
            wall, cpu = await batch(concurrency, size, job)
            walls[name].append(wall / size)
            cpus[name] += cpu
    n = size * rounds
    ours_s, raw_s = statistics.median(walls["ours"]), statistics.median(walls["raw"])
    print(
        f"concurrency {concurrency:2}: {1 / ours_s:6.1f} rollouts/s ({1000 * ours_s:6.1f} ms each, cpu {1000 * cpus['ours'] / n:5.1f} ms)   "
        f"raw {1 / raw_s:6.1f}/s ({1000 * raw_s:6.1f} ms, cpu {1000 * cpus['raw'] / n:5.1f} ms)   ratio {ours_s / raw_s:.2f}x",
        flush=True,
    )


async def main(total: int) -> None:
    with bench_settings(uid_count=256) as settings:
        uid = uid_pool_end(settings) if os.geteuid() == 0 else None
        backends = Backends(settings)  # one per server, as the app has (built once, its isolation probed once)

        async def ours() -> None:
            result = await run_rollout(REQUEST, settings=settings, backends=backends)
            assert result.status is RolloutStatus.COMPLETED and result.reward == 1.0, result

        async def raw() -> None:
            await raw_commands(uid)

        await batch(4, 8, ours)  # warm-up
        await batch(4, 8, raw)
        print(f"load average {os.getloadavg()[0]:.2f}; rollouts per batch: 1, {max(total, 32)}, {max(total, 128)}; raw reference runs the same 4 commands as bwrap spawns" + (f" as uid {uid}" if uid else ""))
        await level(1, 1, max(total // 2, 10), ours, raw)  # one each, alternating
        for concurrency in (8, 32):
            # Batches of several waves each, so the last wave's ramp-down weighs little.
            await level(concurrency, max(total, 4 * concurrency), 3, ours, raw)
        await clean_room_cost(settings, backends, max(total // 2, 20))
        await backends.aclose()
        print(f"load average {os.getloadavg()[0]:.2f}")


async def clean_room_cost(settings: Settings, backends: Backends, rounds: int) -> None:
    """Verify in a clean room against verify in the workspace: the verify stage's time and the whole rollout's."""
    verify: dict[str, list[float]] = {"workspace": [], "clean_room": []}
    whole: dict[str, list[float]] = {"workspace": [], "clean_room": []}
    for _ in range(rounds):
        for name, request in (("workspace", WORKSPACE_REQUEST), ("clean_room", CLEAN_ROOM_REQUEST)):
            started = time.perf_counter()
            result = await run_rollout(request, settings=settings, backends=backends)
            whole[name].append(time.perf_counter() - started)
            assert result.reward == 1.0 and result.verify_context == name, result
            verify[name].append(result.timings.verify_s)
    med = {name: (statistics.median(verify[name]) * 1000, statistics.median(whole[name]) * 1000) for name in verify}
    print(
        f"clean room: verify p50 {med['clean_room'][0]:6.1f} ms against {med['workspace'][0]:6.1f} ms in the workspace "
        f"(+{med['clean_room'][0] - med['workspace'][0]:.1f} ms); rollout p50 {med['clean_room'][1]:6.1f} ms against "
        f"{med['workspace'][1]:6.1f} ms (+{med['clean_room'][1] - med['workspace'][1]:.1f} ms)",
        flush=True,
    )


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 96))
