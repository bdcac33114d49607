"""Every bench in `bench/` runs to the end with a tiny N, so a bench that no longer runs fails the suite.

One test per `bench/[!_]*.py` (a new bench is covered at once, and fails until it is given tiny arguments in
`BENCHES`). Each runs as a subprocess of the project's Python from the repository root, in this environment
(`DOCKER_HOST` included), with a temp dir of its own as `TMPDIR` and a deadline; it must exit 0 and print at
least one figure. Nothing is asserted about the figures themselves: on a shared machine they move. Afterwards
the run must have left nothing behind: no process of its own (marked by an environment variable every
descendant inherits unless a bench hands it a clean environment), no mount and no file in its `TMPDIR`.

Benches with needs of their own: `sandbox.py` measures Docker when a daemon answers at `DOCKER_HOST` and says it
skipped it otherwise (a failure under CI, where `.ci/run` starts dockerd, as in tests/backends); `ws.py` and
`startup.py` need openenv 0.10.0's virtualenv (made, or waited for, as tests/compat does; skipped when pip cannot
reach the index); `llamacpp.py` needs llama-server built by scripts/llama_server.sh (not waited for: a build in
progress is tests/llm's to wait for): without it the test checks the bench says how to build it, then skips.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTHON = Path(sys.executable)
"""The interpreter running the suite (the project's virtualenv under `scripts/test`), wherever the checkout is."""
DEADLINE_S = 300.0
"""Per bench; the tiny runs take seconds (the longest, `rollout.py`, 25 to 50 s on 2 cores as load varies)."""
INTERRUPT_GRACE_S = 30.0
"""After the deadline: how long a bench has, after SIGINT (which runs its `finally` blocks), before SIGKILL."""
MARKER = "CAE_BENCH_TEST_RUN"

BENCHES: dict[str, list[str]] = {
    # 1 run of Terminus (the cheapest agent: no CLI to start) and of `nop`.
    "agents.py": ["1", "terminus"],
    # 2 rollouts per round; section 3's 10,000 instant tasks are fixed (about 10 s).
    "batch.py": ["2"],
    # 1 round of a group of 2 against 2 independent members, a tiny setup (5 MB, 50 modules), local and Docker.
    "group.py": ["1", "--group", "2", "--data-mb", "5", "--modules", "50"],
    # Latency cases 2 times each; the 32 x 20-step throughput run is fixed (about 1 s).
    "episode.py": ["2"],
    # 2 rollouts per case (off, metrics, metrics + tracing).
    "observe.py": ["2"],
    # 1 repetition of each call each way, 8 tokens: about 40 calls to SmolLM2-135M.
    "llamacpp.py": ["--calls", "1", "--max-tokens", "8"],
    # The default concurrency (64) on purpose: above the relay's default per-token cap (16), which the bench
    # must lift for its single token (else 429s).
    "llm.py": ["--calls", "2", "--streams", "128", "--rounds", "1"],
    # 3 commands per tier (plain, unisolated, bubblewrap, Landlock).
    "isolation.py": ["3"],
    # 3 starts each way (with and without verify's path guard).
    "verify_guard.py": ["3"],
    # 8 WebSocket clients, 1 oracle rollout each, after the idle reference (3 s of probes).
    "load.py": ["--clients", "8", "--rollouts", "1", "--deadline", "120"],
    # Batches have floors (32 and 128 rollouts, 20 clean-room rounds) so their figures mean something: 25-50 s.
    "rollout.py": ["1"],
    # 2 local samples; Docker's floor is 10 samples (about 8 s with a daemon).
    "sandbox.py": ["2"],
    "startup.py": ["1"],
    "trace.py": ["2"],
    "ws.py": ["--iterations", "5", "--seconds", "0.2"],
}
"""Tiny arguments per bench script."""

FIGURE = re.compile(r"\d(?:\.\d+)?\s?(?:ms|us|s|x|MiB|/s)\b")
"""A measured figure: a number with a unit of time, rate, size or ratio ("7.84 ms", "1.16x", "35.5 rollouts/s")."""


def discovered() -> list[str]:
    return sorted(path.name for path in (ROOT / "bench").glob("[!_]*.py"))


def test_table_names_only_benches_that_exist() -> None:
    stale = sorted(set(BENCHES) - set(discovered()))
    assert not stale, f"BENCHES in {__file__} names benches no longer in bench/: {stale}"


def _openenv_venv() -> None:
    from tests.compat import venvs

    try:
        venvs.released_client(venvs.GEN_B)  # bench/ws.py's REFERENCE_VENV
    except venvs.IndexUnreachable as exc:
        pytest.skip(str(exc))


def _sandbox_checks(out: str) -> None:
    if "docker: skipped" in out:
        if os.environ.get("CI") == "true":
            pytest.fail(f"bench/sandbox.py found no Docker daemon under CI: {out}")
        print("bench/sandbox.py: its Docker part skipped (no daemon at DOCKER_HOST)")
    else:
        assert "docker sandbox create+exec+close" in out, out


NEEDS: dict[str, Callable[[], None]] = {"ws.py": _openenv_venv, "startup.py": _openenv_venv}
"""What a bench needs before it runs (skips, saying why, when it cannot be had)."""
CHECKS: dict[str, Callable[[str], None]] = {"sandbox.py": _sandbox_checks}
"""Checks of a bench's output beside a figure line."""


@pytest.fixture
def bench_tmp() -> Iterator[Path]:
    """The bench's TMPDIR: traversable (0711), as sandbox uids must reach the state dirs benches make in it."""
    path = Path(tempfile.mkdtemp(prefix="cae-bench-test-"))
    os.chmod(path, 0o711)
    yield path
    subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=False)


def run_bench(name: str, args: list[str], tmp: Path, marker: str) -> tuple[int, str, str, float]:
    """Run `bench/<name> <args>` in its own process group: (exit code, stdout, stderr, seconds). At the deadline
    the group gets SIGINT, then SIGKILL, and the test fails."""
    env = {**os.environ, "TMPDIR": str(tmp), MARKER: marker}
    started = time.monotonic()
    proc = subprocess.Popen([str(PYTHON), f"bench/{name}", *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=INTERRUPT_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        pytest.fail(f"bench/{name} {' '.join(args)} ran past {DEADLINE_S:g} s\n{out[-3000:]}\n{err[-3000:]}")
    return proc.returncode, out, err, time.monotonic() - started


def marked_processes(marker: str) -> list[int]:
    """PIDs of live processes whose environment carries `MARKER=marker`."""
    needle = f"{MARKER}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def mounts_under(path: Path) -> list[str]:
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return [point for point in points if point.startswith(str(path) + "/")]


def assert_nothing_left(name: str, tmp: Path, marker: str) -> None:
    """Fails if the bench left a process, a mount or a file behind; kills those processes first (by PID: only
    descendants of the bench carry the marker)."""
    deadline = time.monotonic() + 5  # a killed child may still be exiting
    while (pids := marked_processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    mounts = mounts_under(tmp)
    files = sorted(str(p.relative_to(tmp)) for p in tmp.iterdir())
    assert not (pids or mounts or files), f"bench/{name} left behind: processes {pids}, mounts {mounts}, files {files}"


@pytest.mark.parametrize("name", discovered())
def test_bench_runs(name: str, bench_tmp: Path) -> None:
    if name not in BENCHES:
        pytest.fail(f"bench/{name} has no tiny arguments: add it to BENCHES in {__file__}")
    args = BENCHES[name]
    if name in NEEDS:
        NEEDS[name]()
    if name == "llamacpp.py":
        from tests.llm.llamacpp_server import CACHE, built

        # Not waiting for a build in progress (CI's runs in the background; tests/llm wait for it): without the
        # binary now, the bench exits 0 saying how to build it, and that path must work too.
        if not built(wait_s=0):
            code, out, err, _ = run_bench(name, args, bench_tmp, secrets.token_hex(8))
            assert code == 0 and "scripts/llama_server.sh" in out, (code, out, err[-3000:])
            pytest.skip(f"llama-server not built in {CACHE}: scripts/llama_server.sh builds it (about 17 minutes)")
    marker = secrets.token_hex(8)
    code, out, err, seconds = run_bench(name, args, bench_tmp, marker)
    print(f"\n--- bench/{name} {' '.join(args)}: exit {code} in {seconds:.1f} s\n{out}", end="")
    assert code == 0, f"bench/{name} {' '.join(args)} exited {code}:\n{err[-5000:]}"
    assert any(FIGURE.search(line) for line in out.splitlines()), f"bench/{name} printed no figure:\n{out}{err}"
    if name in CHECKS:
        CHECKS[name](out)
    assert_nothing_left(name, bench_tmp, marker)
