"""Added latency and throughput of the LLM relay and the gate versus calling the fake LLM directly.

    .venv/bin/python bench/llm.py [--calls 300] [--concurrency 64] [--streams 640]

Separate processes, like production: the fake LLM (uvicorn), the relay (its own process, as in the server, with
the server's public relay route `/llm/v1` in front of it on a port of its own: `public`, as remote sandboxes call),
the gate (`coding-agent-env gate` whose policy generates with the fake LLM, as a trainer's engine would, then
the gate synthesises the stream), and this client. Same run, same client, same
machine: latency p50/p99 per sequential call (streamed, 20 tokens) and throughput at N concurrent streams.
Each agent dialect (`messages`, `responses`, `google`) three ways: translated to chat completions by the relay,
passed through to the fake serving it natively (`/pass`), and the fake called in it directly (`/direct`).
`--token-delay-ms 5` paces the fake like a real model (CPU is then not the bottleneck on a 2-core box).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
        "stream_options": {"include_usage": True}}


_policy_http: aiohttp.ClientSession | None = None


async def fake_policy(request: Any) -> dict[str, Any]:
    """Gate policy for the bench: generate with the fake LLM (non-streamed), as a trainer's engine would."""
    global _policy_http
    if _policy_http is None:
        _policy_http = aiohttp.ClientSession()
    body = {**request.body, "stream": False}
    body.pop("stream_options", None)
    async with _policy_http.post(os.environ["BENCH_FAKE_URL"] + "/chat/completions", json=body) as response:
        result: dict[str, Any] = await response.json()
        return result


async def _relay_main(fake_url: str, out: str) -> None:
    """The relay, and the server's public relay route in front of it (`/llm/v1` on its own port, as remote
    sandboxes reach it), in one process like the server."""
    import socket

    import uvicorn
    from starlette.applications import Starlette
    from starlette.routing import Mount

    from coding_agent_env.api.relay_route import PublicRelayRoute
    from coding_agent_env.llm import SharedRelay, Upstream
    from coding_agent_env.settings import Settings

    # One token stands for every concurrent stream of five paths (relay, public and the three dialects) over every
    # round here: lift the per-rollout caps on calls in flight and on calls in all (at the defaults, 3 rounds x 5
    # paths x 960 calls pass the 10,000 a rollout may make, and the bench ended in a 429). The state dir is in
    # the parent's temp dir, which the parent removes (this process ends by SIGKILL).
    state = Path(out).parent / "relay-state"
    state.mkdir()
    settings = Settings(state_dir=state, relay_max_calls_per_token=100_000, relay_max_turns=10**9)
    shared = SharedRelay(settings)
    relay = await shared.get()
    lease = await relay.open_lease("bench", Upstream(base_url=fake_url, api_key=None, model="m"))  # type: ignore[arg-type]
    native = Upstream(base_url=fake_url, api_key=None, model="m",  # type: ignore[arg-type]
                      native_dialects=frozenset({"anthropic", "responses", "google"}))
    passing = await relay.open_lease("bench-pass", native)
    sock = socket.socket()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", 0))
    app = Starlette(routes=[Mount("/llm", app=PublicRelayRoute(shared, settings))])
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    public = f"http://127.0.0.1:{sock.getsockname()[1]}/llm/v1"
    Path(out).write_text(json.dumps({"base_url": lease.base_url, "public_url": public, "token": lease.token,
                                     "pass_url": passing.base_url, "pass_token": passing.token}))
    await serving


def _spawn(argv: list[str], ready: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(argv, cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL,
                            env={**os.environ, **(env or {})})
    deadline = time.monotonic() + 20
    while not (ready.exists() and ready.read_text().strip()):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{argv[:4]} did not start")
        time.sleep(0.02)
    return proc


# The same streamed call in each agent dialect. Three paths each: translated by the relay to chat completions
# (`messages`: the translation's cost is its figure minus `relay`'s), passed through to an upstream serving the
# dialect itself (`messages/pass`), and that upstream called directly (`messages/direct`: the pass-through's
# added latency is `/pass` minus `/direct`).
DIALECT_CALLS: dict[str, tuple[str, dict[str, Any]]] = {
    "messages": ("/v1/messages", {"model": "m", "max_tokens": 64, "stream": True,
                               "messages": [{"role": "user", "content": "hi"}]}),
    "responses": ("/v1/responses", {"model": "m", "stream": True, "input": "hi"}),
    "google": ("/v1beta/models/m:streamGenerateContent?alt=sse",
               {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}),
}


async def _call(http: aiohttp.ClientSession, base_url: str, token: str) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    path, body = "/chat/completions", BODY
    if "#" in base_url:  # "<relay url>#<dialect>": the same call in that dialect
        base_url, dialect = base_url.split("#", 1)
        path, body = DIALECT_CALLS[dialect]
        base_url = base_url.removesuffix("/v1")
        headers["x-goog-api-key"] = token
    async with http.post(base_url + path, json=body, headers=headers) as response:
        if response.status != 200:
            raise AssertionError(f"{base_url}{path}: {response.status} {(await response.text())[:300]}")
        async for _ in response.content.iter_any():
            pass


async def _latency(base_url: str, token: str, calls: int) -> tuple[float, float]:
    async with aiohttp.ClientSession() as http:
        for _ in range(20):
            await _call(http, base_url, token)
        samples = []
        for _ in range(calls):
            started = time.perf_counter()
            await _call(http, base_url, token)
            samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return statistics.median(samples), samples[min(len(samples) - 1, int(len(samples) * 0.99))]


async def _throughput(base_url: str, token: str, concurrency: int, total: int) -> float:
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as http:
        queue = list(range(total))

        async def worker() -> None:
            while queue:
                queue.pop()
                await _call(http, base_url, token)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return total / (time.perf_counter() - started)


async def _measure(targets: dict[str, tuple[str, str]], args: argparse.Namespace) -> None:
    """Interleave the paths for `--rounds` rounds (so machine noise hits them alike); report medians."""
    samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in targets}
    for _ in range(args.rounds):
        for name, (url, token) in targets.items():
            p50, p99 = await _latency(url, token, args.calls)
            samples[name].append((p50, p99, await _throughput(url, token, args.concurrency, args.streams)))
    results = {name: tuple(statistics.median(s[i] for s in rows) for i in range(3)) for name, rows in samples.items()}
    d50, d99, drate = results["direct"]
    print(f"median of {args.rounds} interleaved rounds; {args.calls} sequential streamed calls; "
          f"{args.streams} streams at concurrency {args.concurrency}; token delay {args.token_delay_ms} ms")
    print(f"{'path':17} {'p50 ms':>8} {'p99 ms':>8} {'added p50':>10} {'added p99':>10} {'streams/s':>10} {'ratio':>6}")
    for name, (p50, p99, rate) in results.items():
        print(f"{name:17} {p50:8.3f} {p99:8.3f} {p50 - d50:10.3f} {p99 - d99:10.3f} {rate:10.1f} {rate / drate:6.2f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--streams", type=int, default=640)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--token-delay-ms", type=float, default=0.0, help="fake LLM pause between tokens")
    parser.add_argument("--relay-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.relay_child:
        asyncio.run(_relay_main(*args.relay_child))
        return
    tmp = Path(tempfile.mkdtemp())
    procs: list[subprocess.Popen[bytes]] = []
    try:
        fake_argv = [sys.executable, "-m", "tests.fakes.llm", str(tmp / "fake"), "20", str(args.token_delay_ms / 1000),
                     "anthropic,responses,google"]
        procs.append(_spawn(fake_argv, tmp / "fake"))
        fake_url = f"http://127.0.0.1:{(tmp / 'fake').read_text()}/v1"
        procs.append(_spawn([sys.executable, "bench/llm.py", "--relay-child", fake_url, str(tmp / "relay")], tmp / "relay"))
        relay = json.loads((tmp / "relay").read_text())
        gate_argv = [sys.executable, "-m", "coding_agent_env.gate.process", "--rollouts", "1", "--tokens-file",
                     str(tmp / "gate"), "--policy", "bench.llm:fake_policy"]
        procs.append(_spawn(gate_argv, tmp / "gate", {"BENCH_FAKE_URL": fake_url}))
        gate = json.loads((tmp / "gate").read_text().splitlines()[0])
        targets = {"direct": (fake_url, "none"), "relay": (relay["base_url"], relay["token"]),
                   "public": (relay["public_url"], relay["token"]), "gate": (gate["base_url"], gate["api_key"])}
        for dialect in DIALECT_CALLS:
            targets[dialect] = (relay["base_url"] + "#" + dialect, relay["token"])
            targets[dialect + "/pass"] = (relay["pass_url"] + "#" + dialect, relay["pass_token"])
            targets[dialect + "/direct"] = (fake_url + "#" + dialect, "none")
        asyncio.run(_measure(targets, args))
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
