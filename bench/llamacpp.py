"""Latency and throughput the LLM relay adds in front of a real engine: llama.cpp's `llama-server` with the packaged
SmolLM2-135M-Instruct, called directly and through the relay, the same calls in the same run.

    .venv/bin/python bench/llamacpp.py [--calls 10] [--max-tokens 48] [--threads 1]

Needs the llama-server binary and model that scripts/llama_server.sh builds and caches (about 17 minutes on 2
cores); without them it says so and exits 0.

Four calls, as an agent makes them (temperature 0, `max_tokens` fixed, usage asked for): a short chat and one with
a tool (`bash`), each buffered and streamed. Each goes four ways:

- `direct`: straight to llama-server, as the agent sent it (the reference);
- `black_box`: through an in-process `Relay` lease in `black_box` mode (forwarded as it is);
- `transparent_proxy`: through a lease in `transparent_proxy` mode (engine `llamacpp`, `top_logprobs` 1): the relay
  asks for logprobs, sends a streamed call with tools whole (llama.cpp refuses logprobs with tools + stream) and
  streams the answer itself, and obtains the prompt ids (`/apply-template`, then `/tokenize`) before the answer
  ends;
- `direct+lp`: straight to llama-server, the body as `transparent_proxy` sends it (logprobs asked for; a streamed
  call with tools sent whole): the engine's own share of `transparent_proxy`'s cost, so that
  `transparent_proxy` / `direct+lp` is the relay's.

Interleaved: each repetition runs every call every way, the ways in a rotated order, after an unmeasured call that
puts the prompt in llama.cpp's cache (one slot), so every measured call finds it there. Reported per call and way:
time to the first token (streamed: the first SSE event with content or a tool call; buffered: the answer's first
byte) and to the end, p50 and p90, completion tokens per second of wall time (median), and the ratios to
`direct` (and of `transparent_proxy` to `direct+lp`); then what `transparent_proxy` recorded (turns with ids, where
their prompt ids came from). Calls are 10 ms apart (untimed; see `GAP_S`), a refused call is made again and
counted. Figures, never assertions: CPU shared with anything else running moves them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._common import pct  # noqa: E402
from coding_agent_env.llm import Relay, Upstream  # noqa: E402
from coding_agent_env.models import Mode  # noqa: E402
from coding_agent_env.settings import Settings  # noqa: E402
from tests.llm.llamacpp_server import CACHE, MODEL_NAME, TOOLS, built, llama_server  # noqa: E402

PROMPT = "List the files in the current directory."
WAYS = ("direct", "black_box", "transparent_proxy", "direct+lp")
TOP_LOGPROBS = 1


def calls(max_tokens: int) -> dict[str, dict[str, Any]]:
    """The agent's four calls, by name."""
    base: dict[str, Any] = {"model": MODEL_NAME, "messages": [{"role": "user", "content": PROMPT}],
                            "max_tokens": max_tokens, "temperature": 0}
    out = {}
    for kind, extra in (("chat", {}), ("tool", {"tools": TOOLS})):
        out[f"{kind}/buffered"] = {**base, **extra, "stream": False}
        out[f"{kind}/streamed"] = {**base, **extra, "stream": True, "stream_options": {"include_usage": True}}
    return out


def as_transparent_sends(body: dict[str, Any]) -> dict[str, Any]:
    """The body `transparent_proxy` sends llama.cpp for the agent's `body` (engines/llamacpp.py)."""
    sent = {**body, "logprobs": True, "top_logprobs": TOP_LOGPROBS}
    if sent.get("stream") and sent.get("tools"):
        sent["stream"] = False
        sent.pop("stream_options", None)
    return sent


@dataclass
class Sample:
    first_s: float
    total_s: float
    completion_tokens: int


@dataclass
class Way:
    name: str
    url: str
    token: str | None
    rewrite: bool = False
    samples: dict[str, list[Sample]] = field(default_factory=dict)


class Refused(Exception):
    """A call not answered 200."""


GAP_S = 0.01
"""Pause between calls, not timed (an agent's think time is longer): llama-server closes its connection after each
streamed answer without saying so, and a request sent at once on that pooled connection fails."""


async def call(http: aiohttp.ClientSession, way: Way, body: dict[str, Any], failures: list[str]) -> Sample:
    """`one_call`, again (up to twice) when it was refused; each refusal kept in `failures`."""
    for attempt in range(3):
        await asyncio.sleep(GAP_S)
        try:
            return await one_call(http, way, body)
        except (Refused, aiohttp.ClientError) as exc:
            failures.append(f"{way.name}: {exc}"[:200])
            if attempt == 2:
                kind = "streamed" if body.get("stream") else "buffered"
                raise SystemExit(f"{way.name}: a {kind} call failed 3 times: {exc}")
    raise AssertionError


def _has_token(event: dict[str, Any]) -> bool:
    for choice in event.get("choices") or []:
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("tool_calls") or delta.get("reasoning_content"):
            return True
    return False


async def one_call(http: aiohttp.ClientSession, way: Way, body: dict[str, Any]) -> Sample:
    headers = {"Authorization": f"Bearer {way.token}"} if way.token else {}
    sent = as_transparent_sends(body) if way.rewrite else body
    started = time.perf_counter()
    first: float | None = None
    usage: dict[str, Any] | None = None
    async with http.post(way.url + "/chat/completions", json=sent, headers=headers) as response:
        if response.status != 200:
            raise Refused(f"{response.status} {(await response.text())[:300]}")
        if sent.get("stream"):
            async for line in response.content:
                if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                    continue
                event = json.loads(line[5:])
                if first is None and _has_token(event):
                    first = time.perf_counter()
                usage = event.get("usage") or usage
        else:
            chunks = [await response.content.readany()]
            first = time.perf_counter()
            chunks += [chunk async for chunk in response.content.iter_any()]
            usage = json.loads(b"".join(chunks)).get("usage")
    ended = time.perf_counter()
    tokens = int((usage or {}).get("completion_tokens") or 0)
    return Sample((first or ended) - started, ended - started, tokens)


async def run(args: argparse.Namespace, engine_url: str, state: Path) -> None:
    bodies = calls(args.max_tokens)
    async with Relay(Settings(state_dir=state, relay_read_timeout_s=300)) as relay:
        leases = {}
        for mode in (Mode.BLACK_BOX, Mode.TRANSPARENT_PROXY):
            upstream = Upstream(base_url=engine_url + "/v1", api_key=None, model=MODEL_NAME, mode=mode,
                                top_logprobs=TOP_LOGPROBS if mode is Mode.TRANSPARENT_PROXY else 0,
                                engine="llamacpp")
            leases[mode] = await relay.open_lease(f"bench-{mode.value}", upstream)
        ways = {
            "direct": Way("direct", engine_url + "/v1", None),
            "black_box": Way("black_box", leases[Mode.BLACK_BOX].base_url, leases[Mode.BLACK_BOX].token),
            "transparent_proxy": Way("transparent_proxy", leases[Mode.TRANSPARENT_PROXY].base_url,
                                     leases[Mode.TRANSPARENT_PROXY].token),
            "direct+lp": Way("direct+lp", engine_url + "/v1", None, rewrite=True),
        }
        for way in ways.values():
            way.samples = {name: [] for name in bodies}
        timeout = aiohttp.ClientTimeout(total=600)
        failures: list[str] = []
        started = time.perf_counter()
        async with aiohttp.ClientSession(timeout=timeout) as http:
            for name, body in bodies.items():  # warm-up: every way once, unmeasured
                for way in ways.values():
                    await call(http, way, body, failures)
            for rep in range(args.calls):
                for name, body in bodies.items():
                    await call(http, ways["direct"], {**body, "max_tokens": 1}, failures)  # the prompt into the cache
                    order = list(ways)[rep % len(ways):] + list(ways)[:rep % len(ways)]
                    for key in order:
                        ways[key].samples[name].append(await call(http, ways[key], body, failures))
        elapsed = time.perf_counter() - started
        turns = leases[Mode.TRANSPARENT_PROXY].turns()
        for lease in leases.values():
            await lease.close()
    report(ways, args, elapsed)
    print(f"transparent_proxy recorded {len(turns)} turns: {sum(t.error is None for t in turns)} without error, "
          f"{sum(bool(t.completion_token_ids) for t in turns)} with completion ids, "
          f"{sum(bool(t.prompt_token_ids) for t in turns)} with prompt ids "
          f"(sources {dict(Counter(str(t.prompt_ids_source) for t in turns))}), "
          f"upstream calls {dict(Counter(str(t.upstream_call) for t in turns))}")
    print(f"{len(failures)} calls failed and were made again" + "".join(f"\n  {f}" for f in failures[:10]))


def _ms(samples: list[float], q: float) -> float:
    return pct(samples, q) * 1000


def report(ways: dict[str, Way], args: argparse.Namespace, elapsed: float) -> None:
    print(f"llama.cpp {CACHE.name}, {MODEL_NAME}, {args.threads} threads, one slot; {args.calls} calls per call and "
          f"way (interleaved), max_tokens {args.max_tokens}, temperature 0; {elapsed:.0f} s")
    print("first: time to the first token (streamed) or the first byte (buffered); ratios are p50s (tok/s: medians)"
          " against direct; tp/lp: transparent_proxy against direct+lp (the relay's share)")
    head = (f"{'call':15} {'way':17} {'first p50':>9} {'p90':>7} {'total p50':>9} {'p90':>7} {'tokens':>6} "
            f"{'tok/s':>6} {'added ms':>8} {'first x':>7} {'total x':>7} {'tok/s x':>7}")
    print(head)
    for name in next(iter(ways.values())).samples:
        ref = ways["direct"].samples[name]
        ref_first, ref_total = _ms([s.first_s for s in ref], 0.5), _ms([s.total_s for s in ref], 0.5)
        ref_rate = statistics.median(s.completion_tokens / s.total_s for s in ref)
        for key, way in ways.items():
            rows = way.samples[name]
            first = [s.first_s for s in rows]
            total = [s.total_s for s in rows]
            rate = statistics.median(s.completion_tokens / s.total_s for s in rows)
            tokens = statistics.mean(s.completion_tokens for s in rows)
            print(f"{name:15} {key:17} {_ms(first, 0.5):9.1f} {_ms(first, 0.9):7.1f} {_ms(total, 0.5):9.1f} "
                  f"{_ms(total, 0.9):7.1f} {tokens:6.1f} {rate:6.1f} {_ms(total, 0.5) - ref_total:+8.1f} "
                  f"{_ms(first, 0.5) / ref_first:7.2f} {_ms(total, 0.5) / ref_total:7.2f} {rate / ref_rate:7.2f}")
        lp = ways["direct+lp"].samples[name]
        tp = ways["transparent_proxy"].samples[name]
        lp_total, tp_total = _ms([s.total_s for s in lp], 0.5), _ms([s.total_s for s in tp], 0.5)
        print(f"{name:15} {'tp/lp':17} {'':9} {'':7} {'':9} {'':7} {'':6} {'':6} {tp_total - lp_total:+8.1f} "
              f"{_ms([s.first_s for s in tp], 0.5) / _ms([s.first_s for s in lp], 0.5):7.2f} "
              f"{tp_total / lp_total:7.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=10, help="repetitions of each call each way (default 10)")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1,
                        help="llama-server -t (default 1: on 2 cores, one for the engine, one for relay and client)")
    args = parser.parse_args()
    if not built(wait_s=0):
        print(f"llama-server and its model are not in {CACHE} (or are being built): build them with\n"
              f"    scripts/llama_server.sh    # about 17 minutes on 2 cores, cached\n"
              f"then run this again. Nothing measured.")
        return
    state = Path(tempfile.mkdtemp(prefix="cae-bench-"))
    # llama_server writes its log to $TMPDIR: here, into this run's dir, removed with it when the run works and
    # kept (with a note saying where) when it fails, for the failure to be read.
    os.environ["TMPDIR"] = str(state)
    done = False
    try:
        with llama_server(threads=args.threads) as url:
            asyncio.run(run(args, url, state))
        done = True
    finally:
        if done:
            shutil.rmtree(state, ignore_errors=True)
        else:
            print(f"llama-server's log kept in {state}", file=sys.stderr)


if __name__ == "__main__":
    main()
