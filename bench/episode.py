"""Interactive episodes: the latency of one `terminal` step running `true` (and `echo hi`) in the episode's live
shell, beside a raw `bwrap ... bash -c true` spawn and the one-exec-per-command shell (what backends without a
live shell run) measured in the same run (target: the live step's p50 at most 0.3x a raw spawn), and the
throughput of 32 concurrent episodes of 20 steps each (start, 20 commands, final answer with one verify
command, teardown).

    .venv/bin/python bench/episode.py [N]
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._common import bench_settings, measure, pct, raw_bwrap_argv, uid_pool_end, which_bwrap  # noqa: E402
from coding_agent_env.episode import Episode, parse_task  # noqa: E402
from coding_agent_env.sandbox import Backends  # noqa: E402
from coding_agent_env.sandbox.shell.sandboxed import SandboxShell  # noqa: E402
from coding_agent_env.settings import Settings  # noqa: E402

TASK = {"instruction": "bench", "setup": ["mkdir -p work"], "verify": ["test -d work"]}
CONCURRENT = 32
STEPS = 20


async def spawn(argv: list[str], **creds: object) -> None:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, env={}, **creds  # type: ignore[arg-type]
    )
    assert await proc.wait() == 0


async def latency(settings: Settings, backends: Backends, n: int) -> None:
    episode = await Episode.start(parse_task(TASK), settings=settings, backends=backends)

    async def step() -> None:
        assert (await episode.terminal("true")).exit_code == 0

    async def echo() -> None:
        assert (await episode.terminal("echo hi")).output == "hi\n"

    assert episode.sandbox is not None and episode.report().shell == "live"
    shell_dir = f"{episode.sandbox.paths.logs}/per-command"
    await episode.sandbox.mkdir(shell_dir)
    per_command = SandboxShell(episode.sandbox, shell_dir, max_output_bytes=settings.episode_max_output_bytes)

    async def exec_step() -> None:
        assert (await per_command.run("true", timeout_s=30)).exit_code == 0

    with tempfile.TemporaryDirectory() as workdir:
        raw = raw_bwrap_argv(which_bwrap(), workdir) + ["bash", "-c", "true"]
        cases: dict[str, Callable[[], Awaitable[None]]] = {"raw bwrap spawn `bash -c true`": lambda: spawn(raw)}
        if os.geteuid() == 0:  # as root an episode's commands run as a pool uid: the like-for-like reference
            os.chmod(workdir, 0o777)
            uid = uid_pool_end(settings)
            cases["raw bwrap `bash -c true`, as a uid"] = lambda: spawn(raw, user=uid, group=uid, extra_groups=[])
        cases["one exec per command `true` (no live shell)"] = exec_step
        cases["episode terminal step `true`"] = step
        cases["episode terminal step `echo hi`"] = echo
        samples = await measure(cases, n)
    await episode.close()
    for step_case in [name for name in samples if name.startswith("episode")]:
        ours = pct(samples[step_case], 0.5)
        for ref in [name for name in samples if not name.startswith("episode")]:
            target = " (target <= 0.3x)" if ref.startswith("raw") else ""
            print(f"ratio p50 {step_case} / {ref}: {ours / pct(samples[ref], 0.5):.2f}x{target}")


async def throughput(settings: Settings, backends: Backends) -> None:
    async def one() -> float | None:
        episode = await Episode.start(parse_task(TASK), settings=settings, backends=backends)
        for _ in range(STEPS):
            assert (await episode.terminal("cd /workspace/work && echo step >> log")).exit_code == 0
        return (await episode.final_answer("done")).reward

    started = time.perf_counter()
    rewards = await asyncio.gather(*(one() for _ in range(CONCURRENT)))
    wall = time.perf_counter() - started
    assert rewards == [1.0] * CONCURRENT, rewards
    steps = CONCURRENT * STEPS
    print(f"{CONCURRENT} concurrent episodes x {STEPS} steps: {wall:.2f} s wall, {steps / wall:.0f} steps/s, "
          f"{CONCURRENT / wall:.1f} episodes/s (each: start, {STEPS} commands, final answer + verify, teardown)")


async def main(n: int) -> None:
    with bench_settings() as settings:
        async with Backends(settings) as backends:
            print(f"isolation: {backends.get('local').check().isolation}; euid {os.geteuid()}; n={n}")
            await latency(settings, backends, n)
            await throughput(settings, backends)


if __name__ == "__main__":
    numbers = [arg for arg in sys.argv[1:] if arg.isdigit()]
    asyncio.run(main(int(numbers[0]) if numbers else 200))
