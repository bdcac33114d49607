"""What metrics and tracing cost a rollout: oracle rollouts (bench/rollout.py's task) through a server session,
with observation off, with the metrics on (what `/metrics` counts at each result), and with the metrics and
tracing on (spans to an in-memory exporter), alternating in rounds in the same run so load hits all three alike.
Target: metrics under 2% of a rollout's wall time. Also each listener's own time per result, measured apart.

    .venv/bin/python bench/observe.py [ROUNDS]   (default 30: 30 rollouts per case at concurrency 1)
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._common import bench_settings, pct  # noqa: E402
from bench.rollout import REQUEST  # noqa: E402
from coding_agent_env.models import RolloutStatus  # noqa: E402
from coding_agent_env.observe.metrics import ServerMetrics  # noqa: E402
from coding_agent_env.observe.tracing import Tracing  # noqa: E402
from coding_agent_env.sandbox import Backends  # noqa: E402
from coding_agent_env.session import SessionKind, SessionManager  # noqa: E402


def _tracing() -> Tracing:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    return Tracing(SimpleSpanProcessor(InMemorySpanExporter()))


async def main(rounds: int) -> None:
    with bench_settings() as settings:
        async with Backends(settings) as backends:
            managers: dict[str, SessionManager] = {}
            for case in ("off", "metrics", "metrics + tracing"):
                metrics = ServerMetrics(backends=settings.sandbox_backends) if case != "off" else None
                manager = SessionManager(settings, backends, metrics=metrics)
                if metrics is not None:
                    manager.on_result.append(metrics.rollout_finished)
                if case == "metrics + tracing":
                    manager.tracing = _tracing()
                managers[case] = manager
            sessions = {case: manager.create(SessionKind.WS) for case, manager in managers.items()}
            samples: dict[str, list[float]] = {case: [] for case in sessions}
            results = []
            for _ in range(rounds):
                for case, session in sessions.items():
                    started = time.perf_counter()
                    result = await session.run(REQUEST)
                    samples[case].append(time.perf_counter() - started)
                    assert result.status is RolloutStatus.COMPLETED and result.reward == 1.0, result.error
                    results.append(result)
            for manager in managers.values():
                await manager.stop()
    off = pct(samples["off"], 0.5)
    for case, values in samples.items():
        print(f"{case:18} p50 {pct(values, 0.5) * 1000:8.2f} ms   p90 {pct(values, 0.9) * 1000:8.2f} ms   "
              f"ratio p50 to off {pct(values, 0.5) / off:.3f}x" + ("  (target metrics < 1.02x)" if case == "metrics" else ""))
    # The listeners alone, on the results just made: what each rollout pays beyond its own work.
    metrics, tracing = ServerMetrics(backends=["local"]), _tracing()
    for name, listen in (("metrics.rollout_finished", metrics.rollout_finished),
                         ("tracing.rollout", lambda r: tracing.rollout(r, started_ns=time.time_ns()))):
        started = time.perf_counter()
        for result in results:
            listen(result)
        each = (time.perf_counter() - started) / len(results)
        print(f"{name:26} {each * 1e6:8.1f} us per result ({each / off * 100:.3f}% of a rollout's p50)")
    tracing.shutdown()


if __name__ == "__main__":
    numbers = [arg for arg in sys.argv[1:] if arg.isdigit()]
    asyncio.run(main(int(numbers[0]) if numbers else 30))
