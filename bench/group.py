"""GRPO groups with a shared setup: a group of G rollouts of one task whose setup does real work (a package
tree of small modules, byte-compiled, and a large data file written and hashed, in the home directory as
installers put them: about 3 s here at the defaults), run as one group (`group_id`: set up once, every member
forked from the template) beside the same G rollouts as independent members, at the same concurrency (G), in
the same run. Prints wall time and CPU per group (the host's busy CPU time over the group's run: run it on a
quiet machine), their ratios, the fork's p50/p99 per member (target: at least 4x less wall per group; a local
fork under 50 ms p50), and the bound no fork can pass here (independent wall over the template's setup).

On the local backend (as root: overlay forks), and on Docker when a daemon answers at DOCKER_HOST and the
backend forks (the offline test image of tests/backends, imported if missing), its templates frozen as
`--docker-fork` says (`DOCKER_FORK`: auto, layers or image).

    .venv/bin/python bench/group.py [ROUNDS] [--group G] [--data-mb MB] [--modules N] [--no-docker]
                                    [--docker-fork auto|layers|image]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._common import bench_settings, pct  # noqa: E402
from coding_agent_env.models import RolloutRequest, RolloutResult, RolloutStatus  # noqa: E402
from coding_agent_env.rollout import run_rollout  # noqa: E402
from coding_agent_env.sandbox import Backends  # noqa: E402
from coding_agent_env.sandbox.base import SandboxSpec  # noqa: E402
from coding_agent_env.settings import DockerConfig, Settings  # noqa: E402


def setup_command(modules: int, data_mb: int) -> str:
    """Dependencies installed where installers put them, in the home directory (a package tree byte-compiled, a
    large data file written and hashed), and a small project in the workdir."""
    dirs = max(1, modules // 100)
    return (
        f"mkdir -p ~/deps/pkg && cd ~/deps && for d in $(seq {dirs}); do mkdir -p pkg/m$d && "
        f"touch pkg/m$d/__init__.py && for f in $(seq {min(modules, 100)}); do "
        f"printf 'VALUE = %d\\n\\ndef f(x):\\n    return x * VALUE\\n' $f > pkg/m$d/f$f.py; done; done && "
        f"touch pkg/__init__.py && python3 -m compileall -q pkg && head -c {data_mb}M /dev/urandom > data.bin && "
        f"sha256sum data.bin > data.sha256 && cd - && printf 'print(1)\\n' > main.py"
    )


def member(index: int, setup: str, group: str | None, sandbox: str) -> RolloutRequest:
    return RolloutRequest.model_validate({
        "instruction": "count the modules", "agent": "oracle", "sandbox": sandbox, "setup": [setup],
        "solution": [f"find ~/deps/pkg -name '*.py' | wc -l > count-{index}", "test -s ~/deps/data.bin"],
        "verify": [f"test -s count-{index}"], "command_timeout_s": 600, **({"group_id": group} if group else {}),
    })


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_s() -> float:
    """The host's busy CPU seconds so far (every process: sandboxes' commands are not all this one's reaped
    descendants; run the bench on a quiet machine)."""
    with open("/proc/stat") as fh:
        fields = [int(v) for v in fh.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / _TICK


async def one_group(backends: Backends, sandbox: str, size: int, setup: str, group: str | None
                    ) -> tuple[float, float, list[RolloutResult]]:
    cpu, wall = cpu_s(), time.perf_counter()
    results = await asyncio.gather(*(run_rollout(member(i, setup, group, sandbox), backends=backends)
                                     for i in range(size)))
    wall, cpu = time.perf_counter() - wall, cpu_s() - cpu
    bad = [r for r in results if r.status is not RolloutStatus.COMPLETED or r.reward != 1.0]
    assert not bad, f"{len(bad)} members failed: {bad[0].error} {bad[0].setup_results[-1:]}"
    return wall, cpu, results


async def compare(backends: Backends, sandbox: str, rounds: int, size: int, setup: str) -> None:
    grouped_wall, grouped_cpu, alone_wall, alone_cpu, forks = [], [], [], [], []
    for n in range(rounds):
        # Interleaved, so machine noise hits both alike; each grouped round a group of its own.
        wall, cpu, results = await one_group(backends, sandbox, size, setup, f"bench-{sandbox}-{n}")
        assert all(r.group and r.group.setup == "forked" for r in results), results[0].group
        grouped_wall.append(wall)
        grouped_cpu.append(cpu)
        forks += [r.group.fork_s for r in results if r.group and r.group.fork_s is not None]
        wall, cpu, _ = await one_group(backends, sandbox, size, setup, None)
        alone_wall.append(wall)
        alone_cpu.append(cpu)
        while len(backends.templates):  # this round's template expires (GROUP_IDLE_S is short here)
            await asyncio.sleep(0.02)
        await backends.templates.drain()
    g_wall, a_wall = pct(grouped_wall, 0.5), pct(alone_wall, 0.5)
    g_cpu, a_cpu = pct(grouped_cpu, 0.5), pct(alone_cpu, 0.5)
    template_s = pct([r.group.template_setup_s or 0 for r in results if r.group], 0.5)
    methods = sorted({r.group.method or "?" for r in results if r.group})
    print(f"{sandbox}: a group of {size}, {rounds} round(s), template ({'/'.join(methods)}) setup {template_s:.2f} s")
    print(f"  wall per group  grouped {g_wall:7.2f} s   independent {a_wall:7.2f} s   {a_wall / g_wall:5.2f}x less")
    print(f"  CPU per group   grouped {g_cpu:7.2f} s   independent {a_cpu:7.2f} s   {a_cpu / max(g_cpu, 1e-9):5.2f}x less")
    ms = [f * 1000 for f in forks]
    print(f"  fork per member p50 {pct(ms, 0.5):7.2f} ms   p99 {pct(ms, 0.99):7.2f} ms   (target: p50 < 50 ms local)")
    # A group cannot take less than its template's setup: with C cores, G independent members take about G/C
    # setups, so no way of forking gains more than this here.
    print(f"  bound: independent / template setup = {a_wall / max(template_s, 1e-9):5.2f}x "
          f"(what a free snapshot, fork and run would reach on {os.cpu_count()} CPUs)")


async def docker_backends(settings: Settings, fork: str) -> Backends | None:
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        import docker

        from tests.backends.rootfs import HOST_BINDS, IMAGE, ensure_image

        client = docker.DockerClient(base_url=host)
        try:
            ensure_image(client)
        finally:
            client.close()
    except Exception as exc:  # any failure to reach the daemon means: no docker rows
        print(f"docker: skipped (no daemon at {host}: {type(exc).__name__})")
        return None
    config = DockerConfig(host=host, image=IMAGE, host_binds=HOST_BINDS, fork=fork)
    backends = Backends(settings.with_backends(*settings.backends, config))
    refusal = backends.get("docker").fork_refusal(SandboxSpec(rollout_id="probe"))
    if refusal is not None:
        print(f"docker: skipped (the backend does not fork here: {refusal})")
        await backends.aclose()
        return None
    return backends


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rounds", nargs="?", type=int, default=3)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--data-mb", type=int, default=300)
    parser.add_argument("--modules", type=int, default=3000)
    parser.add_argument("--no-docker", action="store_true")
    parser.add_argument("--docker-fork", choices=("auto", "layers", "image"), default="auto")
    args = parser.parse_args()
    setup = setup_command(args.modules, args.data_mb)
    with bench_settings() as base:
        settings = base.model_copy(update={"group_idle_s": 0.1, "sandbox_disk_mb": max(4096, args.data_mb * 3)})
        async with Backends(settings) as backends:
            refusal = backends.get("local").fork_refusal(SandboxSpec(rollout_id="probe"))
            if refusal is None:
                await compare(backends, "local", args.rounds, args.group, setup)
            else:
                print(f"local: skipped (the backend does not fork here: {refusal})")
        if not args.no_docker:
            docker = await docker_backends(settings, args.docker_fork)
            if docker is not None:
                async with docker:
                    await compare(docker, "docker", args.rounds, args.group, setup)


if __name__ == "__main__":
    asyncio.run(main())
