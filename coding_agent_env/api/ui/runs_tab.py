"""The web tab's "Runs" view: what the results store holds (batches, and the server's own rollouts when
`RESULTS_FROM_SERVER` is on), filtered by task, agent, status and reward; charts of the rollouts the filters
select (`runs.charts`: pass rate and mean reward per task, the reward distribution, phase times, throughput per
minute, limits hit) and each task as the curriculum sampler weighs it; and one rollout's page: its verdict,
commands and outputs, files, LLM turns, timings and raw result.

Reads only; the store is opened per action (other processes may write it meanwhile: SQLite WAL, or a shared
PostgreSQL database), and the handlers are plain functions, which Gradio runs on its worker threads, off the
server's event loop. A store that cannot be reached is a note in the view, its URL's password redacted.
"""

from __future__ import annotations

import html
import logging
import time
from typing import Any

import gradio as gr

import pandas as pd

from coding_agent_env.api.ui import render
from coding_agent_env.api.ui.result_view import result_tabs
from coding_agent_env.models import AGENT_NAMES, RolloutStatus
from coding_agent_env.runs import charts
from coding_agent_env.runs.store import Filters, ResultsStore, ResultsStoreError, default_path
from coding_agent_env.settings import Settings

__all__ = ["ROLLOUT_COLUMNS", "runs_tab"]

ROLLOUT_COLUMNS = ["rollout_id", "finished", "task", "attempt", "agent", "sandbox", "status", "reward", "seconds"]
RUN_COLUMNS = ["run", "started", "origin", "rollouts", "mean reward", "command"]
_LIST_LIMIT = 500
_CHART_LIMIT = 5000
"""Rollouts the charts read at most (the newest matching the filters)."""
CHARTS = ("pass", "rewards", "phases", "throughput", "limits", "tasks")
"""The chart tables, in the order the view's outputs take them (`tasks` is a table: the curriculum's view)."""

log = logging.getLogger(__name__)


def _when(stamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))


def _open(settings: Settings) -> tuple[ResultsStore | None, str]:
    """The store (None when there is none yet, or it cannot be reached) and, without one, why (redacted)."""
    path = default_path(settings)
    if not path.exists():
        return None, f"No results store yet at {path}: run a batch (`coding-agent-env run`)."
    try:
        return ResultsStore(path), ""
    except ResultsStoreError as exc:  # a database server down is a notice in the view, not a traceback
        return None, f"The results store cannot be read: {exc}"


def _bound(text: str | None) -> float | None:
    try:
        return float(text) if text and text.strip() else None
    except ValueError:
        return None


def list_rows(settings: Settings, task: str, agent: str, status: str, min_reward: str, max_reward: str,
              run_id: str) -> tuple[list[list[object]], list[list[object]], str]:
    """(the rollouts matching, the runs, a note) for the filters as the form gives them ("" means any; a reward
    bound that is not a number is ignored)."""
    store, why = _open(settings)
    if store is None:
        return [], [], why
    with store:
        filters = Filters(run_id or None, task or None, agent or None, status or None, _bound(min_reward),
                          _bound(max_reward))
        rows = store.rollouts(filters, _LIST_LIMIT)
        runs = store.runs()
    rollouts = [[r.rollout_id, _when(r.finished), r.task_id, r.attempt, r.agent, r.sandbox, r.status,
                 "" if r.reward is None else round(r.reward, 4), round(r.wall_s, 2)] for r in rows]
    run_rows = [[r.run_id, _when(r.started), r.origin, r.rollouts,
                 "" if r.mean_reward is None else round(r.mean_reward, 4), r.description] for r in runs]
    return rollouts, run_rows, f"{len(rollouts)} rollouts shown (newest first, at most {_LIST_LIMIT})."


def chart_tables(settings: Settings, task: str, agent: str, status: str, min_reward: str, max_reward: str,
                 run_id: str) -> dict[str, pd.DataFrame]:
    """Each chart's table (`CHARTS`) for the filters as the form gives them; empty tables without a store."""
    store, _ = _open(settings)
    measured: list[Any] = []
    outcomes: list[Any] = []
    if store is not None:
        with store:
            filters = Filters(run_id or None, task or None, agent or None, status or None, _bound(min_reward),
                              _bound(max_reward))
            try:
                measured = store.measures(filters, _CHART_LIMIT)
                outcomes = store.task_outcomes(filters)[:_LIST_LIMIT]
            except ResultsStoreError:  # a database down mid-way: empty charts, the list's notice says why
                log.exception("runs view: the charts' query failed")
                measured, outcomes = [], []
    rows = [row for row, _ in measured]
    tables = {"pass": charts.per_task(rows), "rewards": charts.reward_histogram(rows),
              "phases": charts.phase_times(measured), "throughput": charts.throughput(rows),
              "limits": charts.limits(measured), "tasks": charts.curriculum_view(outcomes)}
    columns = {"pass": ["task", "rollouts", "pass rate", "mean reward"], "rewards": ["reward", "rollouts"],
               "phases": ["phase", "p50 s", "p90 s"], "throughput": ["minute", "rollouts"],
               "limits": ["limit", "rollouts"],
               "tasks": ["task", "rollouts", "scored", "passes", "p", "signal", "mean s", "weight"]}
    frames = {name: pd.DataFrame(table, columns=columns[name]) for name, table in tables.items()}
    frames["throughput"]["minute"] = pd.to_datetime(frames["throughput"]["minute"])  # a time axis, not labels
    return frames


def timings_html(result: Any) -> str:
    timings = result.timings.model_dump()
    cells = "".join(f"<td>{html.escape(name.removesuffix('_s'))}</td><td>{value:.3f}s</td>"
                    for name, value in timings.items())
    return f'<table class="cae-timings"><tr>{cells}</tr></table>'


def rollout_page(settings: Settings, rollout_id: str) -> dict[str, Any]:
    """The parts of one rollout's page, by name; `notice` alone when it cannot be shown."""
    store, _ = _open(settings)
    rollout_id = (rollout_id or "").strip()
    result = None
    if store is not None and rollout_id:
        with store:
            result = store.result(rollout_id)
    if result is None:
        return {"notice": render.message_html(f"No rollout {rollout_id!r} in the results store.")}
    return {**render.result_parts(result), "timings": timings_html(result)}


def runs_tab(settings: Settings) -> None:
    """Lay out the Runs view and wire its events (call inside a `gr.Tab`)."""
    with gr.Row():
        task = gr.Textbox(label="task contains", elem_id="runs-task")
        agent = gr.Dropdown(["", *AGENT_NAMES], value="", label="agent", elem_id="runs-agent")
        status = gr.Dropdown(["", *(s.value for s in RolloutStatus)], value="", label="status", elem_id="runs-status")
        # Text, not gr.Number: an empty Number arrives as 0, which would filter everything but reward 0 out.
        min_reward = gr.Textbox(label="reward at least", elem_id="runs-min-reward")
        max_reward = gr.Textbox(label="reward at most", elem_id="runs-max-reward")
        run_id = gr.Textbox(label="run", elem_id="runs-run")
    refresh = gr.Button("Refresh", elem_id="runs-refresh")
    note = gr.Markdown(elem_id="runs-note")
    rollouts = gr.Dataframe(headers=ROLLOUT_COLUMNS, label="Rollouts (select a row to open it)", wrap=True,
                            interactive=False, elem_id="runs-rollouts")
    with gr.Accordion("Runs", open=False):
        runs = gr.Dataframe(headers=RUN_COLUMNS, label="Runs", wrap=True, interactive=False, elem_id="runs-runs")
    with gr.Accordion("Charts (the rollouts the filters select)", open=True):
        with gr.Row():
            plots = {"pass": gr.BarPlot(x="task", y="pass rate", label="Pass rate per task", y_lim=[0, 1],
                                        elem_id="runs-chart-pass"),
                     "rewards": gr.BarPlot(x="reward", y="rollouts", label="Reward distribution",
                                           elem_id="runs-chart-rewards")}
        with gr.Row():
            plots["phases"] = gr.BarPlot(x="phase", y="p50 s", label="Phase time p50 (s)", elem_id="runs-chart-phases")
            plots["throughput"] = gr.LinePlot(x="minute", y="rollouts", label="Rollouts finished per minute",
                                              elem_id="runs-chart-throughput")
            plots["limits"] = gr.BarPlot(x="limit", y="rollouts", label="Limits hit", elem_id="runs-chart-limits")
        plots["tasks"] = gr.Dataframe(label="Tasks as the curriculum sampler weighs them (pass rate p under its "
                                      "prior, signal for a group of 8, normalised weight)", interactive=False,
                                      elem_id="runs-tasks")
    with gr.Row():
        chosen = gr.Textbox(label="rollout id", elem_id="runs-rollout-id")
        open_button = gr.Button("Open", elem_id="runs-open")
    page = {"notice": gr.HTML(elem_id="runs-verdict"), "timings": gr.HTML(elem_id="runs-timings")}
    page.update(result_tabs({"verify": "runs-verify", "files": "runs-files", "turns": "runs-turns"}))

    def refreshed(*values: Any) -> tuple[Any, ...]:
        tables = chart_tables(settings, *values)
        return (*list_rows(settings, *values), *(tables[name] for name in CHARTS))

    def opened(rollout_id: str) -> dict[Any, Any]:
        parts = rollout_page(settings, rollout_id)
        return {page[name]: value for name, value in parts.items()}

    def selected(event: gr.SelectData, table: Any) -> str:
        row = event.index[0] if isinstance(event.index, (list, tuple)) else event.index
        try:
            return str(table.iloc[row, 0])
        except (AttributeError, IndexError):
            return ""

    filters = [task, agent, status, min_reward, max_reward, run_id]
    refresh.click(refreshed, filters, [rollouts, runs, note, *(plots[name] for name in CHARTS)])
    open_button.click(opened, [chosen], list(page.values()))
    rollouts.select(selected, [rollouts], [chosen]).then(opened, [chosen], list(page.values()))
