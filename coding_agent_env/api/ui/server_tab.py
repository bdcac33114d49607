"""The web tab's "Server" view: what the server is doing now, from the same metrics `/metrics` serves
(`observe.metrics`): sessions and episodes live, rollouts finished by status, mean phase times, LLM calls by
outcome, and rollouts finished per minute over the last half hour, refreshed every few seconds.

The handler is a coroutine, so Gradio runs it on the server's event loop, where the live figures are read.
"""

from __future__ import annotations

import html
import time
from collections import deque
from typing import Any

import gradio as gr
import pandas as pd

from coding_agent_env.models.results import PHASES
from coding_agent_env.observe.metrics import ServerMetrics

__all__ = ["ServerView", "server_tab"]

REFRESH_S = 5.0
_HISTORY = 360
"""Samples kept for the per-minute chart (half an hour at `REFRESH_S`)."""


def _totals(metrics: ServerMetrics) -> dict[str, Any]:
    """The figures the view shows, summed from the registry's samples."""
    figures: dict[str, Any] = {"sessions": {}, "episodes": 0.0, "capacity": 0.0, "rollouts": {}, "phase_sum": {},
                               "phase_count": {}, "llm": {}}
    for family in metrics.registry.collect():
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, sample.value
            if name.endswith("sessions_live"):
                figures["sessions"][labels.get("kind", "")] = value
            elif name.endswith("episodes_live"):
                figures["episodes"] = value
            elif name.endswith("sessions_capacity"):
                figures["capacity"] = value
            elif name.endswith("rollouts_finished_total"):
                status = labels.get("status", "")
                figures["rollouts"][status] = figures["rollouts"].get(status, 0.0) + value
            elif name.endswith("rollout_phase_seconds_sum"):
                figures["phase_sum"][labels.get("phase", "")] = value
            elif name.endswith("rollout_phase_seconds_count"):
                figures["phase_count"][labels.get("phase", "")] = value
            elif name.endswith("relay_calls_total"):
                outcome = labels.get("status_class", "")
                figures["llm"][outcome] = figures["llm"].get(outcome, 0.0) + value
    return figures


def _table(rows: list[tuple[str, str]]) -> str:
    cells = "".join(f"<tr><th>{html.escape(name)}</th><td>{html.escape(value)}</td></tr>" for name, value in rows)
    return f'<table class="cae-server">{cells}</table>'


class ServerView:
    """The view's state: the rollouts-finished samples behind its per-minute chart."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics
        self.samples: deque[tuple[float, float]] = deque(maxlen=_HISTORY)

    def render(self) -> tuple[str, pd.DataFrame, pd.DataFrame]:
        """(the figures as HTML, mean seconds per phase, rollouts finished per minute between samples)."""
        figures = _totals(self.metrics)
        finished = sum(figures["rollouts"].values())
        now = time.time()
        self.samples.append((now, finished))
        sessions = figures["sessions"]
        rows = [
            ("sessions live", f"{sum(sessions.values()):g} of {figures['capacity']:g} "
                              f"({', '.join(f'{kind} {count:g}' for kind, count in sorted(sessions.items()) if count)})"),
            ("episodes live", f"{figures['episodes']:g}"),
            ("rollouts finished", f"{finished:g} (" + ", ".join(
                f"{status} {count:g}" for status, count in sorted(figures["rollouts"].items()) if count) + ")"),
            ("LLM calls", ", ".join(f"{outcome} {count:g}" for outcome, count in sorted(figures["llm"].items()))
             or "none yet"),
            ("upstream errors", f"{sum(v for k, v in figures['llm'].items() if k in ('5xx', 'error')):g}"),
        ]
        phases = pd.DataFrame([
            {"phase": phase, "mean s": round(figures["phase_sum"].get(phase, 0.0) / count, 3) if count else 0.0}
            for phase in PHASES for count in [figures["phase_count"].get(phase, 0.0)]])
        rate = [{"time": pd.Timestamp(later, unit="s"), "rollouts per minute": (b - a) * 60 / (later - earlier)}
                for (earlier, a), (later, b) in zip(self.samples, list(self.samples)[1:]) if later > earlier]
        return _table(rows), phases, pd.DataFrame(rate, columns=["time", "rollouts per minute"])


def server_tab(metrics: ServerMetrics) -> None:
    """Lay out the Server view and its timer (call inside a `gr.Tab`)."""
    view = ServerView(metrics)
    figures = gr.HTML(elem_id="server-figures")
    with gr.Row():
        phases = gr.BarPlot(x="phase", y="mean s", label="Mean phase time (s)", elem_id="server-chart-phases")
        rate = gr.LinePlot(x="time", y="rollouts per minute", label="Rollouts finished per minute",
                           elem_id="server-chart-rate")
    timer = gr.Timer(REFRESH_S)

    async def refreshed() -> tuple[str, pd.DataFrame, pd.DataFrame]:
        return view.render()

    timer.tick(refreshed, outputs=[figures, phases, rate])
    gr.on(None, refreshed, outputs=[figures, phases, rate])  # no trigger: once when the page loads
