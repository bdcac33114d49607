"""Shared bits of the benchmarks: percentiles, a throwaway state dir, raw bwrap argv for references, and a server
subprocess waited for and stopped by its process group."""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from coding_agent_env.sandbox.local.provision import remove_root
from coding_agent_env.settings import LocalConfig, Settings


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def describe(name: str, samples: list[float]) -> str:
    ms = [s * 1000 for s in samples]
    return f"{name:34} p50 {pct(ms, 0.5):7.2f} ms   p99 {pct(ms, 0.99):7.2f} ms   mean {statistics.mean(ms):7.2f} ms"


async def measure(cases: dict[str, Callable[[], Awaitable[None]]], n: int) -> dict[str, list[float]]:
    """Each case `n` times (after a few warm-ups), interleaved so machine noise hits every case alike; prints
    each case's percentiles and returns the samples (seconds)."""
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(min(5, n)):
        for case in cases.values():
            await case()
    for _ in range(n):
        for name, case in cases.items():
            t0 = time.perf_counter()
            await case()
            samples[name].append(time.perf_counter() - t0)
    for name, values in samples.items():
        print(describe(name, values))
    return samples


@contextmanager
def bench_settings(uid_count: int = 4096) -> Iterator[Settings]:
    """Settings of a fresh state dir, the local backend's uid pool (as root) `uid_count` uids from 500000."""
    state = Path(tempfile.mkdtemp(prefix="cae-bench-"))
    os.chmod(state, 0o711)
    try:
        yield Settings(state_dir=state, backends=(LocalConfig(uid_base=500_000, uid_count=uid_count),))
    finally:
        # Roots of sandboxes a failed run left open are tmpfs mounts (as root): unmounted, then removed.
        for root in list(state.iterdir()) if state.is_dir() else []:
            remove_root(root, tmpfs=True)
        shutil.rmtree(state, ignore_errors=True)


def uid_pool_end(settings: Settings) -> int:
    """The last uid of the local backend's pool (one no sandbox of a short run takes)."""
    local = settings.backend_config("local")
    assert isinstance(local, LocalConfig)
    return local.uid_base + local.uid_count - 1


def raw_bwrap_argv(bwrap: str, workdir: str) -> list[str]:
    """What one would type by hand for a comparable sandbox: same namespaces and binds, no bookkeeping."""
    args = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--unshare-user", "--uid", "1000", "--gid", "1000", "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    for top in ("/bin", "/sbin", "/lib", "/lib64"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--bind", workdir, "/workspace", "--chdir", "/workspace", "--"]
    return args


def which_bwrap() -> str:
    found = shutil.which("bwrap")
    assert found, "bench needs bubblewrap on PATH"
    return found


def wait_healthy(url: str, proc: subprocess.Popen[bytes], deadline: float, why: Callable[[], str]) -> None:
    """Poll `url`/health until it answers 200; SystemExit with `why()` if `proc` ends or `deadline` (monotonic)
    passes first."""
    import httpx  # the benches that start servers have it; the others need not import it

    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(why())
        time.sleep(0.05)


def stop_group(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM `proc`'s process group, SIGKILL it if it has not ended within `grace_s`."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
