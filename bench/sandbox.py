"""Local sandbox cost: create -> exec `true` -> close, beside a raw `bwrap ... true` spawn and a plain
subprocess, measured in the same run. Prints p50/p99 and the ratio to the raw bwrap spawn (target <= 1.5x).

    .venv/bin/python bench/sandbox.py [N]
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._common import bench_settings, describe, pct, raw_bwrap_argv, which_bwrap  # noqa: E402
from coding_agent_env.sandbox import SandboxSpec, get_backend  # noqa: E402


async def spawn(argv: list[str], **creds: object) -> None:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, env={}, **creds  # type: ignore[arg-type]
    )
    assert await proc.wait() == 0


async def main(n: int) -> None:
    with bench_settings() as settings, tempfile.TemporaryDirectory() as workdir:
        backend = get_backend("local", settings)
        print(f"isolation: {backend.check().isolation}  ({backend.check().detail}); euid {os.geteuid()}; n={n}")
        raw = raw_bwrap_argv(which_bwrap(), workdir) + ["true"]

        async def ours() -> None:
            box = await backend.create(SandboxSpec(rollout_id="bench"))
            done = await box.exec(["true"], timeout=10, max_output_bytes=1024)
            assert done.exit_code == 0
            await box.close()

        cases = {"plain subprocess `true`": lambda: spawn(["/bin/true"]), "raw bwrap spawn `true`": lambda: spawn(raw)}
        if os.geteuid() == 0:
            # As root our sandboxes run as a pool uid (so RLIMIT_NPROC holds): the like-for-like reference
            # is the same raw spawn under such a uid.
            os.chmod(workdir, 0o777)
            uid = settings.sandbox_uid_base + settings.sandbox_uid_count - 1
            cases["raw bwrap spawn `true`, as a uid"] = lambda: spawn(raw, user=uid, group=uid, extra_groups=[])
        cases["sandbox create+exec+close"] = ours
        samples: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(5):
            for case in cases.values():
                await case()
        for _ in range(n):  # interleaved so machine noise hits every case alike
            for name, case in cases.items():
                t0 = time.perf_counter()
                await case()
                samples[name].append(time.perf_counter() - t0)
        for name, values in samples.items():
            print(describe(name, values))
        ours_p50 = pct(samples["sandbox create+exec+close"], 0.5)
        for ref in [name for name in samples if name.startswith("raw bwrap")]:
            print(f"ratio p50 sandbox / {ref}: {ours_p50 / pct(samples[ref], 0.5):.2f}x (target <= 1.5x)")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 200))
