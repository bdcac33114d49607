"""Sandbox cost per backend: create -> exec `true` -> close, beside the raw references measured in the same
run. Prints p50/p99 and the ratios.

- local: beside a raw `bwrap ... true` spawn and a plain subprocess (target <= 1.5x of raw bwrap).
- docker (when a daemon answers at DOCKER_HOST): beside a raw `docker run --rm --network none` of the same
  image running `true` (target <= 1.2x). Uses the offline test image of tests/backends (imported if missing).

    .venv/bin/python bench/sandbox.py [N] [--docker-only]
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
from collections.abc import Awaitable, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._common import bench_settings, measure, pct, raw_bwrap_argv, uid_pool_end, which_bwrap  # noqa: E402
from coding_agent_env.sandbox import Backends, SandboxSpec  # noqa: E402
from coding_agent_env.settings import DockerConfig, Settings  # noqa: E402


async def spawn(argv: list[str], env: dict[str, str] | None = None, **creds: object) -> None:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, env=env or {}, **creds  # type: ignore[arg-type]
    )
    assert await proc.wait() == 0


def docker_cases(settings: Settings, backends: list[Backends]) -> dict[str, Callable[[], Awaitable[None]]]:
    """The Docker backend and its raw `docker run --rm` reference, or nothing when no daemon answers (the
    `Backends` it makes are appended to `backends`, for the caller to close)."""
    import docker

    from tests.backends.rootfs import HOST_BINDS, IMAGE, ensure_image

    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        client = docker.DockerClient(base_url=host)  # asks the daemon its API version: the first contact
        client.ping()
    except Exception as exc:  # any failure to reach the daemon means: no docker rows
        print(f"docker: skipped (no daemon at {host}: {type(exc).__name__})")
        return {}
    try:
        ensure_image(client)
    finally:
        client.close()
    backends.append(Backends(settings.with_backends(DockerConfig(host=host, image=IMAGE, host_binds=HOST_BINDS))))
    backend = backends[-1].get("docker")
    binds = [arg for path in HOST_BINDS for arg in ("-v", f"{path}:{path}:ro")]
    raw = ["docker", "-H", host, "run", "--rm", "--network", "none", *binds, IMAGE, "/usr/bin/true"]

    async def ours() -> None:
        box = await backend.create(SandboxSpec(rollout_id="bench"))
        done = await box.exec(["true"], timeout=30, max_output_bytes=1024)
        assert done.exit_code == 0
        await box.close()

    return {"raw docker run --rm `true`": lambda: spawn(raw, env=dict(os.environ)),
            "docker sandbox create+exec+close": ours}


async def main(n: int, docker_only: bool) -> None:
    with bench_settings() as settings:
        if not docker_only:
            await local(settings, n)
        made: list[Backends] = []
        cases = docker_cases(settings, made)
        if cases:
            n_docker = max(10, n // 10)  # a container costs ~100x a bwrap spawn
            print(f"docker, n={n_docker}")
            samples = await measure(cases, n_docker)
            ratio = pct(samples["docker sandbox create+exec+close"], 0.5) / pct(samples["raw docker run --rm `true`"], 0.5)
            print(f"ratio p50 docker sandbox / raw docker run --rm: {ratio:.2f}x (target <= 1.2x)")
        for backends in made:
            await backends.aclose()


async def local(settings: Settings, n: int) -> None:
    with tempfile.TemporaryDirectory() as workdir:
        backend = Backends(settings).get("local")  # nothing to close: the local backend holds no client
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
            uid = uid_pool_end(settings)
            cases["raw bwrap spawn `true`, as a uid"] = lambda: spawn(raw, user=uid, group=uid, extra_groups=[])
            # The same through setpriv, as one would by hand: Python spawns with vfork (it forks the whole
            # interpreter when it must change credentials itself), so this isolates the cost of the uid.
            setpriv = shutil.which("setpriv")
            if setpriv is not None:
                as_uid = [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", *raw]
                cases["raw bwrap spawn `true`, setpriv uid"] = lambda: spawn(as_uid)
        cases["sandbox create+exec+close"] = ours
        samples = await measure(cases, n)
        ours_p50 = pct(samples["sandbox create+exec+close"], 0.5)
        for ref in [name for name in samples if name.startswith("raw bwrap")]:
            print(f"ratio p50 sandbox / {ref}: {ours_p50 / pct(samples[ref], 0.5):.2f}x (target <= 1.5x)")


if __name__ == "__main__":
    numbers = [arg for arg in sys.argv[1:] if arg.isdigit()]
    asyncio.run(main(int(numbers[0]) if numbers else 200, "--docker-only" in sys.argv))
