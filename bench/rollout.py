"""Oracle rollouts (1 setup, 1 solution, 2 verify commands) at concurrency 1, 8 and 32: rollouts/s, and wall
time against running the same four commands as raw bwrap spawns (same binds, same credentials) in the same run.
Targets: at concurrency 1 within 1.3x of the raw commands; at 32, at least 40 rollouts/s on 2 cores.

    .venv/bin/python bench/rollout.py [ROLLOUTS_PER_LEVEL]
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._common import bench_settings, raw_bwrap_argv, which_bwrap  # noqa: E402
from coding_agent_env.models import RolloutRequest, RolloutStatus  # noqa: E402
from coding_agent_env.rollout import run_rollout  # noqa: E402
from coding_agent_env.settings import Settings  # noqa: E402

COMMANDS = ["echo 1 > a.txt", "echo 2 > b.txt", "grep -qx 1 a.txt", "grep -qx 2 b.txt"]
REQUEST = RolloutRequest(
    instruction="write b.txt", agent="oracle", setup=[COMMANDS[0]], solution=[COMMANDS[1]], verify=COMMANDS[2:]
)


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


async def level(concurrency: int, total: int, job: object) -> float:
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            await job()  # type: ignore[operator]

    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(total)))
    return time.perf_counter() - started


async def main(total: int) -> None:
    with bench_settings() as settings:
        settings = Settings(**{**settings.model_dump(), "sandbox_uid_count": 256})
        uid = settings.sandbox_uid_base + 255 if os.geteuid() == 0 else None

        async def ours() -> None:
            result = await run_rollout(REQUEST, settings=settings)
            assert result.status is RolloutStatus.COMPLETED and result.reward == 1.0, result

        await level(4, 8, ours)  # warm-up
        await level(4, 8, lambda: raw_commands(uid))
        print(f"{total} rollouts per level; raw reference runs the same 4 commands as bwrap spawns" + (f" as uid {uid}" if uid else ""))
        for concurrency in (1, 8, 32):
            n = total if concurrency > 1 else max(total // 4, 10)
            ours_s = await level(concurrency, n, ours)
            raw_s = await level(concurrency, n, lambda: raw_commands(uid))
            print(
                f"concurrency {concurrency:2}: {n / ours_s:6.1f} rollouts/s ({1000 * ours_s / n:6.1f} ms each)   "
                f"raw {n / raw_s:6.1f}/s ({1000 * raw_s / n:6.1f} ms)   ratio {ours_s / raw_s:.2f}x"
            )


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 96))
