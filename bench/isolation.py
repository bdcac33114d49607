"""What each local isolation tier costs per command: `exec(true)` in an open sandbox under bubblewrap, Landlock
and seccomp, and unisolated, beside a plain subprocess running `true` and the bare start of the interpreter the
Landlock tier adds (`python -I -S -c pass`), all measured in the same run. Prints p50/p99 and the ratios to the
plain subprocess.

    .venv/bin/python bench/isolation.py [N]
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._common import bench_settings, measure, pct  # noqa: E402
from coding_agent_env.sandbox import Backends, Sandbox, SandboxSpec  # noqa: E402
from coding_agent_env.settings import LocalConfig  # noqa: E402
from coding_agent_env.settings import Settings  # noqa: E402

TIERS = ("bwrap", "landlock", "none")
OUT = 64 * 1024


async def spawn(argv: list[str]) -> None:
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.DEVNULL, env={})
    assert await proc.wait() == 0


def exec_true(box: Sandbox) -> Callable[[], Awaitable[None]]:
    async def run() -> None:
        done = await box.exec(["true"], timeout=30, max_output_bytes=OUT)
        assert done.exit_code == 0, done.stderr

    return run


async def main(n: int) -> None:
    with bench_settings() as base:
        opened: list[tuple[Backends, Sandbox]] = []
        cases: dict[str, Callable[[], Awaitable[None]]] = {
            "plain subprocess `true`": lambda: spawn(["true"]),
            "interpreter start (-I -S)": lambda: spawn([sys.executable, "-I", "-S", "-c", "pass"]),
        }
        try:
            for tier in TIERS:
                config = LocalConfig(uid_base=500_000, uid_count=64, isolation=tier)  # type: ignore[arg-type]
                backends = Backends(Settings(state_dir=base.state_dir, backends=(config,)))
                await backends.__aenter__()
                box = await backends.get("local").create(SandboxSpec(rollout_id=f"bench-{tier}"))
                opened.append((backends, box))
                assert box.isolation == tier, f"{tier} unavailable here: {backends.get('local').check().detail}"
                cases[f"exec true: {tier}"] = exec_true(box)
            print(f"euid {os.geteuid()}; n={n}")
            samples = await measure(cases, n)
        finally:
            for backends, box in opened:
                await box.close()
                await backends.__aexit__(None, None, None)
    reference = pct(samples["plain subprocess `true`"], 0.5)
    for name, values in samples.items():
        print(f"{name:34} {pct(values, 0.5) / reference:5.1f}x plain (p50)")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 100))
