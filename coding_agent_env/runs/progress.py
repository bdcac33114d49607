"""The batch's live display (rich): done / running / pass / fail / infra-error counts and an ETA, problems
printed above it as they come; and the summary table at the end."""

from __future__ import annotations

import time
from types import TracebackType

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from coding_agent_env.runs.batch import Job
from coding_agent_env.runs.journal import Record
from coding_agent_env.runs.stats import PHASES, Summary
from coding_agent_env.tasks import TaskError

__all__ = ["LiveProgress", "summary_table"]


class LiveProgress:
    """A `BatchObserver` drawing counts on a console (refreshed a few times a second, not per event)."""

    def __init__(self, console: Console, total: int | None, *, live: bool = True) -> None:
        self.console = console
        self.total = total
        self.running = 0
        self.done = self.passed = self.failed = self.infra = self.skipped_count = self.problems = 0
        self._started = time.monotonic()
        self._live = (Live(console=console, refresh_per_second=4, get_renderable=self._render, transient=True)
                      if live else None)

    def __enter__(self) -> LiveProgress:
        if self._live is not None:
            self._live.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._live is not None:
            self._live.stop()

    def started(self, job: Job) -> None:
        self.running += 1

    def finished(self, record: Record) -> None:
        self.running -= 1
        self._count(record)
        self.done += 1

    def skipped(self, record: Record) -> None:
        self._count(record)
        self.skipped_count += 1

    def refused(self, job: Job, error: TaskError) -> None:
        self.running -= 1
        self.problem(error)

    def problem(self, error: TaskError) -> None:
        self.problems += 1
        kind = "unsupported" if error.unsupported else "bad task"
        self.console.print(Text(f"{kind}: {error.line()}", style="yellow"), soft_wrap=True)

    def _count(self, record: Record) -> None:
        reward = record.result.reward
        if reward is None:
            self.infra += 1
        elif reward >= 1.0:
            self.passed += 1
        else:
            self.failed += 1

    def line(self) -> str:
        finished = self.done + self.skipped_count
        total = f"/{self.total}" if self.total else ""
        elapsed = time.monotonic() - self._started
        eta = ""
        if self.total and self.done:
            remaining = max(self.total - finished - self.problems, 0)
            eta = f"  ETA {remaining * elapsed / self.done:.0f}s"
        resumed = f" ({self.skipped_count} from earlier)" if self.skipped_count else ""
        return (f"done {finished}{total}{resumed}  running {self.running}  pass {self.passed}  fail {self.failed}  "
                f"infra-error {self.infra}  problems {self.problems}  {elapsed:.0f}s{eta}")

    def _render(self) -> Text:
        return Text(self.line())


def summary_table(summary: Summary, attempts: int) -> Group:
    """The end-of-batch summary: outcome counts and scores, then per-phase time percentiles."""
    data = summary.as_dict(attempts)
    scores = Table(title="batch summary", show_header=False)
    for key in ("rollouts", "scored", "passed", "failed", "infra_errors", "load_errors", "unsupported",
                "mean_reward", *[k for k in data if k.startswith("pass@")]):
        value = data[key]
        shown = "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)
        scores.add_row(key.replace("_", " "), shown)
    phases = Table(title="seconds per phase")
    for column in ("phase", "p50", "p90", "max"):
        phases.add_column(column, justify="right" if column != "phase" else "left")
    for phase in PHASES:
        row = data["phases"][phase]  # type: ignore[index]
        phases.add_row(phase.removesuffix("_s"), f"{row['p50']:.2f}", f"{row['p90']:.2f}", f"{row['max']:.2f}")
    return Group(scores, phases)
