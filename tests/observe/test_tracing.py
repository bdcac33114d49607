"""OpenTelemetry traces (`observe.tracing`) of a real server's rollout and episode, exported in memory: the span
tree, its attributes, and a caller's W3C `traceparent` continued into ours (over the WebSocket handshake)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from websockets.sync.client import connect

from coding_agent_env.observe.tracing import Tracing
from coding_agent_env.settings import Settings
from tests.helpers import wait_until
from tests.protocol.conftest import oracle_task  # noqa: F401 (a fixture)
from tests.protocol.live import LiveServer
from tests.protocol.test_ws import ask, call

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


@pytest.fixture
def traced(settings: Settings) -> Iterator[tuple[LiveServer, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    server = LiveServer(Settings(state_dir=settings.state_dir, backends=settings.backends),
                        tracing=Tracing(SimpleSpanProcessor(exporter))).start()
    try:
        yield server, exporter
    finally:
        server.stop()


def spans_named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def children(exporter: InMemorySpanExporter, parent: ReadableSpan) -> list[str]:
    return sorted(span.name for span in exporter.get_finished_spans()
                  if span.parent is not None and span.parent.span_id == parent.context.span_id)


def test_a_rollout_and_an_episode_continue_the_callers_trace(traced: tuple[LiveServer, InMemorySpanExporter],
                                                             oracle_task: dict[str, Any]) -> None:
    server, exporter = traced
    with connect(server.ws, additional_headers={"traceparent": PARENT}) as ws:
        result = ask(ws, call({**oracle_task, "task_id": "t-1"}))["data"]["observation"]["result"]["data"]
        assert result["reward"] == 1.0
        opened = ask(ws, {"type": "reset", "data": {"instruction": "x", "verify": ["test -f done"]}})
        assert opened["data"]["done"] is False
        ask(ws, call({"command": "touch done", "final_answer": ""}, "terminal"))
        ask(ws, call({"command": "", "final_answer": "ok"}, "terminal"))
    wait_until(lambda: spans_named(exporter, "episode"), "the episode's span")
    [rollout] = spans_named(exporter, "rollout")
    [episode] = spans_named(exporter, "episode")
    for span in (rollout, episode):  # the caller's trace, continued
        assert format(span.context.trace_id, "032x") == TRACE_ID and span.parent is not None
        assert format(span.parent.span_id, "016x") == "00f067aa0ba902b7"
    attributes = dict(rollout.attributes or {})
    assert (attributes["coding_agent_env.task_id"], attributes["coding_agent_env.status"],
            attributes["coding_agent_env.reward"]) == ("t-1", "completed", 1.0)
    assert attributes["coding_agent_env.rollout_id"] == result["rollout_id"]
    phases = children(exporter, rollout)
    assert {"rollout.provision", "rollout.setup", "rollout.agent", "rollout.verify", "rollout.teardown"} <= set(phases)
    assert all(rollout.start_time <= span.start_time and span.end_time <= rollout.end_time
               for span in exporter.get_finished_spans() if span.name.startswith("rollout."))
    assert children(exporter, episode) == ["episode.final_answer", "episode.terminal"]
    assert dict(episode.attributes or {})["coding_agent_env.status"] == "completed"


def test_llm_calls_are_spans_under_the_agent_phase() -> None:
    """From the turns the relay recorded: each call's own start, latency, status and tokens."""
    from coding_agent_env.models import RolloutResult

    exporter = InMemorySpanExporter()
    tracing = Tracing(SimpleSpanProcessor(exporter))
    result = RolloutResult.model_validate({
        "rollout_id": "r", "agent": "opencode", "status": "completed", "sandbox": "local",
        "timings": {"provision_s": 0.1, "agent_s": 2.0, "verify_s": 0.1, "total_s": 2.2},
        "proxy_turns": [{"turn": 0, "timestamp": 1_700_000_000.5, "latency_s": 0.25, "upstream_status": 200,
                         "model": "m", "usage": {"prompt_tokens": 12, "completion_tokens": 3}},
                        {"turn": 1, "timestamp": 1_700_000_001.0, "latency_s": 0.5, "upstream_status": 500,
                         "error": "upstream 500"}]})
    tracing.rollout(result, started_ns=1_700_000_000 * 10**9)
    [agent] = spans_named(exporter, "rollout.agent")
    calls = sorted(spans_named(exporter, "llm.call"), key=lambda span: span.start_time)
    assert [span.parent.span_id for span in calls] == [agent.context.span_id] * 2  # type: ignore[union-attr]
    assert [(span.end_time - span.start_time) / 1e9 for span in calls] == [0.25, 0.5]
    assert dict(calls[0].attributes or {})["gen_ai.usage.input_tokens"] == 12
    assert calls[0].status.status_code.name == "UNSET" and calls[1].status.status_code.name == "ERROR"
    json.dumps([dict(span.attributes or {}) for span in calls])  # attribute values are plain values


def test_off_unless_configured() -> None:
    assert not Tracing.from_env({}).enabled and not Tracing.from_env({"OTEL_TRACES_EXPORTER": "none"}).enabled
    console = Tracing.from_env({"OTEL_TRACES_EXPORTER": "console"})
    assert console.enabled
    console.shutdown()
    assert not Tracing.from_env({"OTEL_TRACES_EXPORTER": "zipkin"}).enabled
