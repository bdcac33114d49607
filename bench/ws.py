"""WebSocket and JSON-RPC latency and throughput: this server vs a reference built with openenv 0.10.0.

    .venv/bin/python bench/ws.py [--iterations 500] [--seconds 3]

Both servers run as subprocesses on 127.0.0.1 and serve one MCP tool, `run_rollout`. The reference is
openenv 0.10.0's `create_app` over an `MCPEnvironment` with an equivalent one-tool FastMCP server, run in its
own virtualenv (`.ci/venvs/openenv-0.10.0`, created by the compat tests). No rollout runs: the round trip
measured is `reset` + `step(list_tools)` over `/ws`, and `tools/list` over `POST /mcp`.

Each server is measured once it is ready: `/health` answers and `/web/` no longer says "starting" (our Gradio
tab is built in the background after `/health` is up; the reference has no tab). The seconds before, while our
tab builds, are measured apart ("ws p99 while our tab builds"): the tail a trainer connecting at once sees.
With `--runs N` each server is started N times, alternately, and the medians are printed.

Printed: p50/p99 latency (ms) and throughput (reset+step pairs/s) with 1 and 32 concurrent clients, for both
servers, and the ratios (targets: our p50 <= 1/3 of the reference's; our p99 <= the reference's; our 32-client
throughput >= 3x); then our event-loop watchdog's figures (`/health/loop`: largest lag, stalls).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from websockets.asyncio.client import ClientConnection, connect

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere: `bench._common`
from bench._common import stop_group, wait_healthy  # noqa: E402
REFERENCE_VENV = ROOT / ".ci" / "venvs" / "openenv-0.10.0"
CLIENTS = (1, 32)
START_DEADLINE_S = 60.0

REFERENCE_APP = '''
from typing import Any, Optional

from fastmcp import FastMCP
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Observation, State


class ReferenceEnv(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        mcp = FastMCP("reference")

        @mcp.tool
        def run_rollout(instruction: str, agent: str = "opencode") -> dict:
            """Run one rollout."""
            return {"status": "completed", "reward": 1.0}

        super().__init__(mcp)
        self._state = State(episode_id=None, step_count=0)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> Observation:
        self._state = State(episode_id=episode_id or "episode", step_count=0)
        return Observation(done=False, reward=None)

    def _step_impl(self, action: Any, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        return Observation(done=False, reward=None)

    @property
    def state(self) -> State:
        return self._state


app = create_app(ReferenceEnv, CallToolAction, CallToolObservation, env_name="reference", max_concurrent_envs=64)
'''


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def running(argv: list[str], port: int, env: dict[str, str], cwd: Path,
            while_starting: Callable[[str], None] | None = None) -> Iterator[str]:
    """Start a server subprocess, wait for /health, call `while_starting(url)` (if given), wait until it is
    ready, yield its URL, kill its process group."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_DEADLINE_S
        wait_healthy(url, proc, deadline, lambda: f"server {argv[:3]} did not start")
        if while_starting is not None:
            while_starting(url)
        while still_starting(httpx.get(f"{url}/web/", timeout=2)):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"server {argv[:3]} did not finish starting")
            time.sleep(0.05)
        yield url
    finally:
        stop_group(proc, 10)


def still_starting(web: httpx.Response) -> bool:
    """Whether our tab is still being built: its "starting" page (503 with Retry-After; a tab that could not
    start answers 503 without, and the reference's 404 means no tab)."""
    return web.status_code == 503 and "retry-after" in web.headers


RESET = json.dumps({"type": "reset", "data": {}})
STEP = json.dumps({"type": "step", "data": {"type": "list_tools"}})


async def reset_step(ws: ClientConnection) -> float:
    """Seconds of one reset+step round trip over an open socket."""
    started = time.perf_counter()
    await ws.send(RESET)
    await ws.recv()
    await ws.send(STEP)
    await ws.recv()
    return time.perf_counter() - started


async def ws_pairs(url: str, iterations: int) -> list[float]:
    """Latency of `iterations` reset+step round trips over one connection."""
    times = []
    async with connect(url.replace("http", "ws", 1) + "/ws", max_size=None) as ws:
        for _ in range(iterations):
            times.append(await reset_step(ws))
    return times


async def ws_pairs_while_starting(url: str, limit: int) -> list[float]:
    """reset+step round trips from the moment /health answers until the server is ready (at most `limit`)."""
    times = []
    async with httpx.AsyncClient(base_url=url) as client, connect(url.replace("http", "ws", 1) + "/ws") as ws:
        while len(times) < limit and still_starting(await client.get("/web/")):
            for _ in range(10):
                times.append(await reset_step(ws))
    return times


async def rpc_list(url: str, iterations: int) -> list[float]:
    body = {"jsonrpc": "2.0", "method": "tools/list", "params": {}, "id": 1}
    times = []
    async with httpx.AsyncClient(base_url=url) as client:
        for _ in range(iterations):
            started = time.perf_counter()
            response = await client.post("/mcp", json=body)
            assert response.json()["result"]["tools"]
            times.append(time.perf_counter() - started)
    return times


async def throughput(url: str, clients: int, seconds: float) -> float:
    """reset+step pairs per second with `clients` concurrent connections."""
    stop = time.monotonic() + seconds

    async def one() -> int:
        done = 0
        async with connect(url.replace("http", "ws", 1) + "/ws", max_size=None) as ws:
            while time.monotonic() < stop:
                await ws.send(RESET)
                await ws.recv()
                await ws.send(STEP)
                await ws.recv()
                done += 1
        return done

    started = time.monotonic()
    counts = await asyncio.gather(*(one() for _ in range(clients)))
    return sum(counts) / (time.monotonic() - started)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def measure(url: str, iterations: int, seconds: float) -> dict[str, float]:
    await ws_pairs(url, 50)  # warm-up
    pairs = await ws_pairs(url, iterations)
    lists = await rpc_list(url, iterations)
    figures = {"ws_p50_ms": pct(pairs, 0.5), "ws_p99_ms": pct(pairs, 0.99),
               "rpc_p50_ms": pct(lists, 0.5), "rpc_p99_ms": pct(lists, 0.99),
               "ws_mean_ms": statistics.mean(pairs) * 1000}
    for clients in CLIENTS:
        figures[f"tput_{clients}"] = await throughput(url, clients, seconds)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--runs", type=int, default=1, help="start each server this many times; print medians")
    args = parser.parse_args()
    reference_python = REFERENCE_VENV / "bin" / "python"
    if not reference_python.exists():
        raise SystemExit(f"no reference virtualenv at {REFERENCE_VENV}: run tests/compat first (it creates it)")
    runs: dict[str, list[dict[str, float]]] = {"ours": [], "reference": []}
    with tempfile.TemporaryDirectory(prefix="cae-bench-ws-") as tmp:
        # Our server's state dir and Gradio's temp dir (else $TMPDIR/gradio) in this run's dir, removed with it:
        # the server neither reaps the shared default state dir nor leaves anything behind.
        env = {**os.environ, "MAX_CONCURRENT_ENVS": "64", "STATE_DIR": str(Path(tmp, "state")),
               "GRADIO_TEMP_DIR": str(Path(tmp, "gradio"))}
        Path(tmp, "reference_app.py").write_text(REFERENCE_APP)
        for _ in range(args.runs):
            runs["ours"].append(measure_ours(args, env, Path(tmp)))
            port = free_port()
            ref = [str(reference_python), "-m", "uvicorn", "reference_app:app", "--host", "127.0.0.1",
                   "--port", str(port), "--log-level", "warning"]
            with running(ref, port, env, Path(tmp)) as url:
                runs["reference"].append(asyncio.run(measure(url, args.iterations, args.seconds)))
    report({name: medians(figures) for name, figures in runs.items()})


def measure_ours(args: argparse.Namespace, env: dict[str, str], cwd: Path) -> dict[str, float]:
    port = free_port()
    ours = [sys.executable, "-m", "coding_agent_env.cli", "serve", "--port", str(port)]
    starting: list[float] = []

    def while_starting(url: str) -> None:
        starting.extend(asyncio.run(ws_pairs_while_starting(url, args.iterations * 20)))

    with running(ours, port, env, cwd, while_starting) as url:
        figures = asyncio.run(measure(url, args.iterations, args.seconds))
        loop = httpx.get(f"{url}/health/loop", timeout=5)
    if starting:
        figures["starting_ws_p50_ms"] = pct(starting, 0.5)
        figures["starting_ws_p99_ms"] = pct(starting, 0.99)
    if loop.status_code == 200:  # not with LOOP_WATCHDOG=false
        figures["loop_lag_max_ms"] = loop.json()["lag_max_ms"]
        figures["loop_stalls"] = loop.json()["stalls"]
    return figures


def medians(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(run[key] for run in runs if key in run) for key in runs[0]}


def report(results: dict[str, dict[str, float]]) -> None:
    ours, ref = results["ours"], results["reference"]
    print(f"{'metric':<28}{'ours':>12}{'reference':>12}{'ratio':>10}")
    rows = [("ws reset+step p50 (ms)", "ws_p50_ms", False), ("ws reset+step p99 (ms)", "ws_p99_ms", False),
            ("rpc tools/list p50 (ms)", "rpc_p50_ms", False), ("rpc tools/list p99 (ms)", "rpc_p99_ms", False)]
    rows += [(f"throughput {c} client(s) (/s)", f"tput_{c}", True) for c in CLIENTS]
    for label, key, higher_is_better in rows:
        ratio = ours[key] / ref[key] if higher_is_better else ref[key] / ours[key]
        print(f"{label:<28}{ours[key]:>12.2f}{ref[key]:>12.2f}{ratio:>9.2f}x")
    print("ratio = how many times better ours is (latency: ref/ours; throughput: ours/ref)")
    if "starting_ws_p99_ms" in ours:
        print(f"ws reset+step p50 / p99 while our tab builds (ms): {ours['starting_ws_p50_ms']:.2f} / "
              f"{ours['starting_ws_p99_ms']:.2f}")
    if "loop_stalls" in ours:
        print(f"our event loop (whole run, startup included): largest lag {ours['loop_lag_max_ms']:.1f} ms, "
              f"stalls {ours['loop_stalls']:.0f}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
