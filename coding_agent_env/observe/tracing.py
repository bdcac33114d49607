"""OpenTelemetry traces of rollouts and episodes (the `opentelemetry` SDK; off unless configured).

Configured by the standard variables: `OTEL_TRACES_EXPORTER` (`otlp`: OTLP over HTTP, whose endpoint, headers and
timeout come from the `OTEL_EXPORTER_OTLP_*` variables; `console`; unset or `none`: tracing off),
`OTEL_SERVICE_NAME` (default `coding-agent-env`) and `OTEL_RESOURCE_ATTRIBUTES`; the batch processor reads
`OTEL_BSP_*`. The provider is this server's own (never the global one: tests build many servers in a process).

The span tree:
- `rollout` (from the call to its result), with a child per phase (`rollout.provision`, `rollout.setup`,
  `rollout.agent`, `rollout.verify`, `rollout.collect`, `rollout.teardown`, laid end to end from the result's
  timings) and, under `rollout.agent`, one `llm.call` per relayed LLM call (its own start and latency, from the
  turn the relay recorded);
- `episode` (from reset to its end), with one `episode.terminal` / `episode.keystrokes` span per call as it
  runs, and `episode.verify` for the final answer.
Attributes carry the rollout or episode id, task id, agent, backend, status, reward (`coding_agent_env.*`) and
an LLM call's dialect, engine, status and token counts (`gen_ai.*` where the semantic conventions name one).
A caller's trace continues into ours: `parent(headers)` reads a W3C `traceparent` (and `tracestate`) from the
WebSocket handshake, the MCP or the HTTP request, and the session's spans are its children.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from coding_agent_env.models.results import PHASES

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.trace import Span, Tracer

    from coding_agent_env.models import RolloutResult

__all__ = ["Tracing"]

log = logging.getLogger(__name__)

_NS = 1_000_000_000


class Tracing:
    """One server's tracer (or none: every method is then a no-op and costs a branch)."""

    def __init__(self, processor: SpanProcessor | None = None) -> None:
        """`processor`: where spans go (None: tracing off). `from_env` builds it from the `OTEL_*` variables;
        tests pass an in-memory exporter's."""
        self._provider: TracerProvider | None = None
        self._tracer: Tracer | None = None
        if processor is not None:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider

            resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "coding-agent-env")})
            self._provider = TracerProvider(resource=resource)
            self._provider.add_span_processor(processor)
            self._tracer = self._provider.get_tracer("coding_agent_env")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Tracing:
        """Tracing as `OTEL_TRACES_EXPORTER` says (see the module); off when unset, `none`, or when the SDK or
        the exporter is not installed (logged: tracing is an operator's choice, never a reason not to serve)."""
        env = os.environ if environ is None else environ
        kind = env.get("OTEL_TRACES_EXPORTER", "none").strip().lower()
        if kind in ("", "none"):
            return cls()
        try:
            from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

            if kind == "console":
                return cls(BatchSpanProcessor(ConsoleSpanExporter()))
            if kind == "otlp":
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

                return cls(BatchSpanProcessor(OTLPSpanExporter()))
        except ImportError as exc:
            log.warning("OTEL_TRACES_EXPORTER=%s but %s is not installed: tracing off (pip install "
                        "'coding-agent-env[tracing]')", kind, exc.name)
            return cls()
        log.warning("OTEL_TRACES_EXPORTER=%s is not supported (otlp, console or none): tracing off", kind)
        return cls()

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def parent(self, headers: Mapping[str, str]) -> Context | None:
        """The caller's trace context from a W3C `traceparent` header (None: none, or tracing off)."""
        if self._tracer is None:
            return None
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        carrier = {key.lower(): value for key, value in headers.items() if key.lower() in ("traceparent", "tracestate")}
        if "traceparent" not in carrier:
            return None
        return TraceContextTextMapPropagator().extract(carrier)

    def rollout(self, result: RolloutResult, *, started_ns: int, parent: Context | None = None) -> None:
        """The span tree of a finished rollout (see the module), from `started_ns` (`time.time_ns()` when it was
        asked for) to now."""
        tracer = self._tracer
        if tracer is None:
            return
        from opentelemetry import trace

        ended_ns = max(time.time_ns(), started_ns)
        span = tracer.start_span("rollout", context=parent, start_time=started_ns, attributes={
            "coding_agent_env.rollout_id": result.rollout_id, "coding_agent_env.task_id": result.task_id,
            "coding_agent_env.agent": result.agent, "coding_agent_env.backend": result.sandbox or "",
            "coding_agent_env.status": result.status.value,
            **({"coding_agent_env.reward": result.reward} if result.reward is not None else {}),
        })
        if result.error:
            span.set_status(trace.Status(trace.StatusCode.ERROR, result.error[:200]))
        context = trace.set_span_in_context(span)
        at = started_ns
        timings = result.timings
        for phase in PHASES:
            seconds = float(getattr(timings, f"{phase}_s", 0.0) or 0.0)
            if seconds <= 0:
                continue
            end = min(at + int(seconds * _NS), ended_ns)
            child = tracer.start_span(f"rollout.{phase}", context=context, start_time=at)
            if phase == "agent":
                self._llm_calls(tracer, result, trace.set_span_in_context(child))
            child.end(end_time=end)
            at = end
        span.end(end_time=ended_ns)

    @staticmethod
    def _llm_calls(tracer: Tracer, result: RolloutResult, context: Context) -> None:
        for turn in result.proxy_turns:
            if not turn.timestamp:
                continue
            start = int(turn.timestamp * _NS)
            status = turn.upstream_status
            attributes: dict[str, Any] = {"coding_agent_env.turn": turn.turn, "gen_ai.request.model": turn.model or "",
                                          "coding_agent_env.engine": turn.engine or "",
                                          "coding_agent_env.upstream_status": status or 0}
            if turn.usage is not None:
                if turn.usage.prompt_tokens is not None:
                    attributes["gen_ai.usage.input_tokens"] = turn.usage.prompt_tokens
                if turn.usage.completion_tokens is not None:
                    attributes["gen_ai.usage.output_tokens"] = turn.usage.completion_tokens
            span = tracer.start_span("llm.call", context=context, start_time=start, attributes=attributes)
            if turn.error:
                from opentelemetry import trace

                span.set_status(trace.Status(trace.StatusCode.ERROR, str(turn.error)[:200]))
            span.end(end_time=start + int(max(turn.latency_s, 0.0) * _NS))

    def start_episode(self, episode_id: str, task_id: str | None, backend: str,
                      parent: Context | None = None) -> Span | None:
        """The episode's span, open until `end_episode` (None when tracing is off)."""
        if self._tracer is None:
            return None
        return self._tracer.start_span("episode", context=parent, attributes={
            "coding_agent_env.episode_id": episode_id, "coding_agent_env.task_id": task_id or "",
            "coding_agent_env.backend": backend})

    @contextmanager
    def step(self, episode: Span | None, name: str, **attributes: Any) -> Iterator[Span | None]:
        """A span for one episode call (`episode.terminal`, `episode.keystrokes`, `episode.verify`), a child of
        `episode`, around the call."""
        if self._tracer is None or episode is None:
            yield None
            return
        from opentelemetry import trace

        span = self._tracer.start_span(name, context=trace.set_span_in_context(episode), attributes={
            f"coding_agent_env.{key}": value for key, value in attributes.items()})
        try:
            yield span
        finally:
            span.end()

    @staticmethod
    def end_episode(span: Span | None, status: str, reward: float | None = None) -> None:
        if span is None:
            return
        span.set_attribute("coding_agent_env.status", status)
        if reward is not None:
            span.set_attribute("coding_agent_env.reward", reward)
        span.end()

    def shutdown(self) -> None:
        """Flush and stop (the server's shutdown)."""
        if self._provider is not None:
            self._provider.shutdown()
