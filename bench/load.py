"""The event loop under load: `/health` while 128 WebSocket clients run oracle rollouts on a real server.

    .venv/bin/python bench/load.py [--clients 128] [--rollouts 5] [--deadline 600]

One `coding-agent-env serve` on loopback (local backend, its own state dir and uid range). A prober in a process
of its own asks `/health` every `PROBE_EVERY_S`: first while the server is idle (the reference, same run, same
machine), then while `--clients` WebSocket clients each run `--rollouts` oracle rollouts (`step` with
`run_rollout`: 1 setup, 1 solution, 2 verify commands), each client on its own connection.

Printed: `/health` p50/p99 idle and under load and their ratio, rollouts/s and how many passed, and the server's
event-loop watchdog (`/health/loop`) over the loaded phase: its largest lag and its stalls (the loop held at
least `LOOP_STALL_WARN_MS`, default 250 ms) with the last stall's stack. Goal: `/health` p99 under 100 ms under
load and no stall. Bounded: at most `--clients * --rollouts` rollouts, and `--deadline` seconds for the lot.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from websockets.asyncio.client import connect

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._common import pct, stop_group, wait_healthy  # noqa: E402

START_DEADLINE_S = 60.0
PROBE_EVERY_S = 0.02
IDLE_PROBE_S = 3.0
"""How long the idle reference is probed."""
UID_BASE = 520_000
"""The server's sandbox uids (as root): away from the other benches' pools."""
GOAL_P99_MS = 100.0
TASK = {"instruction": "write b.txt", "agent": "oracle", "setup": ["echo 1 > a.txt"],
        "solution": ["echo 2 > b.txt"], "verify": ["grep -qx 1 a.txt", "grep -qx 2 b.txt"]}
STEP = json.dumps({"type": "step", "data": {"type": "call_tool", "tool_name": "run_rollout", "arguments": TASK}})

PROBER = """
import select, sys, time, httpx
url, every = sys.argv[1], float(sys.argv[2])
with httpx.Client(timeout=10) as client:
    print("ready", flush=True)
    while sys.stdin.readline().strip() == "start":
        samples = []
        while not select.select([sys.stdin], [], [], every)[0]:
            started = time.perf_counter()
            try:
                ok = client.get(url).status_code == 200
            except httpx.HTTPError:
                ok = False
            samples.append(time.perf_counter() - started if ok else -1.0)
        sys.stdin.readline()
        print(" ".join(f"{s:.6f}" for s in samples), flush=True)
"""
"""A process of its own, so the clients' loop never delays a probe: `start` starts probing, `stop` stops it
and is answered by one line of samples in seconds (-1 for a failed probe); end of input ends it."""


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def server(tmp: Path, clients: int) -> Iterator[str]:
    """A live server, killed by its process group at the end."""
    os.chmod(tmp, 0o711)  # the sandbox uids reach the state dir through it
    port = free_port()
    env = {**os.environ, "STATE_DIR": str(tmp / "state"), "ENABLE_WEB_INTERFACE": "false",
           "MAX_CONCURRENT_ENVS": str(clients + 8), "SANDBOX_UID_BASE": str(UID_BASE),
           "SANDBOX_UID_COUNT": str(max(256, 2 * clients)), "GRADIO_TEMP_DIR": str(tmp / "gradio"),
           "COLUMNS": "400"}  # the log unwrapped: stall stacks are read back from it
    log = open(tmp / "server.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "coding_agent_env.cli", "serve", "--port", str(port)], env=env,
                            start_new_session=True, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, time.monotonic() + START_DEADLINE_S,
                     lambda: f"the server did not start: {(tmp / 'server.log').read_text()[-2000:]}")
        yield url
    finally:
        stop_group(proc, 30)
        log.close()


class Prober:
    """The prober process (see `PROBER`)."""

    def __init__(self, url: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", PROBER, f"{url}/health", str(PROBE_EVERY_S)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        assert self.stdout.readline().strip() == "ready"

    def start(self) -> None:
        self.stdin.write("start\n")
        self.stdin.flush()

    def stop(self) -> list[float]:
        self.stdin.write("stop\n")
        self.stdin.flush()
        return [float(word) for word in self.stdout.readline().split()]

    def close(self) -> None:
        self.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


async def client(url: str, rollouts: int, deadline: float) -> tuple[int, int]:
    """One WebSocket client running `rollouts` oracle rollouts one after another: (passed, done)."""
    passed = done = 0
    async with connect(url.replace("http", "ws", 1) + "/ws", max_size=None, open_timeout=60) as ws:
        await ws.send(json.dumps({"type": "reset", "data": {}}))
        await ws.recv()
        for _ in range(rollouts):
            if time.monotonic() > deadline:
                break
            await ws.send(STEP)
            frame = json.loads(await asyncio.wait_for(ws.recv(), max(1.0, deadline - time.monotonic())))
            done += 1
            passed += frame.get("data", {}).get("reward") == 1.0
    return passed, done


async def load(url: str, clients: int, rollouts: int, deadline: float) -> tuple[int, int, float]:
    started = time.monotonic()
    results = await asyncio.gather(*(client(url, rollouts, deadline) for _ in range(clients)))
    return sum(p for p, _ in results), sum(d for _, d in results), time.monotonic() - started


def stall_sites(log: str) -> Counter[str]:
    """Where the server's watchdog saw its loop held (its warnings in the log): the innermost frame of this
    package in each stack (`file:line in function`) and the innermost function of all, or what the watchdog
    said when it saw no stack."""
    sites: Counter[str] = Counter()
    for block in log.split("event loop ")[1:]:
        if block.startswith("stalled"):
            sites["(over before the watchdog looked)"] += 1
            continue
        if not block.startswith("blocked"):
            continue
        ours = re.findall(r'File "[^"]*/(coding_agent_env/[^"]+)", line (\d+), in (\w+)', block)
        inner = re.findall(r'File "([^"]+)", line (\d+), in (\w+)', block)
        held = f" (held in {inner[-1][2]})" if inner else ""
        sites[(f"{ours[-1][0]}:{ours[-1][1]} in {ours[-1][2]}" if ours else "outside coding_agent_env") + held] += 1
    return sites


def loop_stats(url: str) -> dict[str, object]:
    return httpx.get(f"{url}/health/loop", timeout=10).json()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=128)
    parser.add_argument("--rollouts", type=int, default=5, help="oracle rollouts per client")
    parser.add_argument("--deadline", type=float, default=600.0, help="seconds for the loaded phase")
    parser.add_argument("--log", type=Path, help="keep the server's log there")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cae-bench-load-") as tmp, server(Path(tmp), args.clients) as url:
        prober = Prober(url)
        try:
            prober.start()
            time.sleep(IDLE_PROBE_S)
            idle = prober.stop()
            before = loop_stats(url)
            prober.start()
            deadline = time.monotonic() + args.deadline
            passed, done, seconds = asyncio.run(load(url, args.clients, args.rollouts, deadline))
            loaded = prober.stop()
            after = loop_stats(url)
        finally:
            prober.close()
        log = (Path(tmp) / "server.log").read_text(errors="replace")
        if args.log is not None:
            args.log.write_text(log)
        sites = stall_sites(log)
    report(idle, loaded, passed, done, seconds, before, after, args)
    if sites:
        print("where the watchdog saw the loop held (its warnings since the server started), most often first:")
    for site, count in sites.most_common(10):
        print(f"   {count:4} x {site}")


def report(idle: list[float], loaded: list[float], passed: int, done: int, seconds: float,
           before: dict[str, object], after: dict[str, object], args: argparse.Namespace) -> None:
    failed = sum(1 for s in loaded if s < 0)
    idle_ms = [s * 1000 for s in idle if s >= 0]
    loaded_ms = [s * 1000 for s in loaded if s >= 0] or [float("nan")]
    print(f"{'/health':<30}{'p50 (ms)':>10}{'p99 (ms)':>10}{'max (ms)':>10}{'probes':>8}")
    print(f"{'idle server (reference)':<30}{pct(idle_ms, 0.5):>10.2f}{pct(idle_ms, 0.99):>10.2f}"
          f"{max(idle_ms):>10.2f}{len(idle_ms):>8}")
    print(f"{f'{args.clients} clients running rollouts':<30}{pct(loaded_ms, 0.5):>10.2f}{pct(loaded_ms, 0.99):>10.2f}"
          f"{max(loaded_ms):>10.2f}{len(loaded_ms):>8}")
    print(f"/health p99 under load / idle: {pct(loaded_ms, 0.99) / pct(idle_ms, 0.99):.2f}x "
          f"(goal: p99 under {GOAL_P99_MS:.0f} ms); failed probes: {failed}")
    print(f"rollouts: {passed} of {done} passed ({args.clients * args.rollouts} asked) in {seconds:.1f} s: "
          f"{done / seconds:.1f} rollouts/s on {os.cpu_count()} cores")
    stalls = int(after["stalls"]) - int(before["stalls"])  # type: ignore[call-overload]
    print(f"event loop: largest lag since start {after['lag_max_ms']:.1f} ms, stalls under load {stalls} "
          f"(threshold {after['stall_threshold_ms']:.0f} ms; goal: 0)")


if __name__ == "__main__":
    main()
