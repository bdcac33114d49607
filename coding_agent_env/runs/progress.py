"""The batch's live display (rich): done / running / pass / fail / infra-error counts and an ETA, problems
printed above it as they come; and, at the end, the summary table and the list of what did not pass (`Failures`:
each refused or unloadable task and each rollout that did not pass, with its status and first reason)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import TracebackType

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from coding_agent_env.models import RolloutStatus
from coding_agent_env.runs.batch import Job
from coding_agent_env.runs.journal import Record
from coding_agent_env.runs.stats import PHASES, Summary
from coding_agent_env.tasks import TaskError
from coding_agent_env.workspace.redact import Redactor

__all__ = ["Failures", "LiveProgress", "summary_table"]

MAX_FAILURE_LINES = 20
"""Lines the end summary gives to what did not pass; the rest are counted (`... and N more`)."""
MAX_REASON_CHARS = 160
"""Characters of each one's reason (its first line), cut at a word."""
MAX_REFUSAL_CHARS = 600
"""Characters of the reason a task never ran (refused, unloadable): the setting and the way out are in its end."""
MAX_NAME_CHARS = 100
"""Characters of each one's name (a task id, or a source path: its last characters)."""

# The order they are listed in: what never ran first, then rollouts that ended without a reward, then the
# agents' own failures, then the scored rollouts that did not pass.
_SEVERITY = {"refused": 0, "load_error": 0, RolloutStatus.SETUP_FAILED.value: 1, RolloutStatus.INFRA_ERROR.value: 1,
             RolloutStatus.CANCELLED.value: 1, RolloutStatus.AGENT_TIMEOUT.value: 2,
             RolloutStatus.AGENT_FAILED.value: 2, "failed": 3}


@dataclass(frozen=True)
class Failure:
    status: str
    """`refused`, `load_error`, a rollout status (`setup_failed`, `infra_error`, `agent_timeout`, ...), or `failed`
    for a completed rollout whose reward is below 1."""
    name: str
    """The task (`task_id`, `#N` for an attempt after the first) or, for a task that never ran, its source."""
    reason: str


@dataclass
class Failures:
    """What did not pass, kept to the `limit` most severe (memory bounded whatever the batch's size), with the
    counts of what never ran."""

    limit: int = MAX_FAILURE_LINES
    redactor: Redactor = field(default_factory=lambda: Redactor([]))
    refused: int = 0
    load_errors: int = 0
    total: int = 0
    kept: list[tuple[int, int, Failure]] = field(default_factory=list)

    def problem(self, error: TaskError) -> None:
        status = "refused" if error.unsupported else "load_error"
        self.refused += error.unsupported
        self.load_errors += not error.unsupported
        self._add(Failure(status, error.source, error.message))

    def record(self, record: Record) -> None:
        result = record.result
        if result.status == RolloutStatus.COMPLETED and result.reward is not None and result.reward >= 1.0:
            return
        name = record.task_id + (f" #{record.attempt}" if record.attempt > 1 else "")
        status = result.status.value
        reward = "" if result.reward is None else f"reward {result.reward:.2f}"
        if status == RolloutStatus.COMPLETED.value:
            status = "failed"
        reason = result.error or result.reward_note or ""
        if not reason and result.status == RolloutStatus.AGENT_FAILED and result.agent_exit_code is not None:
            reason = f"the agent exited {result.agent_exit_code}"
        if not reason and result.reward is not None:
            reason = "the tests did not pass"
        self._add(Failure(status, name, f"{reward}: {reason}" if reward and reason else reward or reason))

    def _add(self, failure: Failure) -> None:
        self.total += 1
        entry = (_SEVERITY.get(failure.status, 2), self.total, failure)
        if len(self.kept) < self.limit:
            self.kept.append(entry)
            return
        worst = max(self.kept)
        if entry < worst:
            self.kept.remove(worst)
            self.kept.append(entry)

    def lines(self) -> list[str]:
        """The list for the end summary: a heading, one line per failure (status, name, first reason; bounded
        and redacted), `... and N more` beyond the limit. Empty when everything passed."""
        if not self.total:
            return []
        shown = [failure for _, _, failure in sorted(self.kept)]
        width = max(len(failure.status) for failure in shown)
        out = [f"not passed: {self.total}"]
        for failure in shown:
            name = self.redactor.text(failure.name)
            name = name if len(name) <= MAX_NAME_CHARS else "..." + name[-(MAX_NAME_CHARS - 3):]  # its end says most
            limit = MAX_REFUSAL_CHARS if failure.status in ("refused", "load_error") else MAX_REASON_CHARS
            out.append(f"  {failure.status:<{width}}  {name}: {self._reason(failure.reason, limit)}")
        if self.total > len(shown):
            out.append(f"  ... and {self.total - len(shown)} more")
        return out

    def _reason(self, reason: str, limit: int) -> str:
        first = next((line.strip() for line in reason.splitlines() if line.strip()), "")
        first = self.redactor.text(first or "(no reason given)")
        if len(first) <= limit:
            return first
        cut = first[: limit - 3]
        return (cut.rsplit(" ", 1)[0] if " " in cut else cut) + "..."

    def exit_line(self) -> str | None:
        """The run's last line when a task was refused or failed to load (why the exit status is not 0)."""
        if not self.refused and not self.load_errors:
            return None
        parts = [f"{count} {what}" for count, what in ((self.refused, "refused"),
                                                       (self.load_errors, "failed to load")) if count]
        tasks = "task" if self.refused + self.load_errors == 1 else "tasks"
        return f"exit status 1: {' and '.join(parts)} ({self.refused + self.load_errors} {tasks} never ran)"


class LiveProgress:
    """A `BatchObserver` drawing counts on a console (refreshed a few times a second, not per event)."""

    def __init__(self, console: Console, total: int | None, *, live: bool = True,
                 failures: Failures | None = None) -> None:
        self.console = console
        self.failures = failures if failures is not None else Failures()
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
        self.failures.record(record)
        self.done += 1

    def skipped(self, record: Record) -> None:
        self._count(record)
        self.failures.record(record)
        self.skipped_count += 1

    def refused(self, job: Job, error: TaskError) -> None:
        self.running -= 1
        self.problem(error)

    def problem(self, error: TaskError) -> None:
        self.problems += 1
        self.failures.problem(error)
        kind = "unsupported" if error.unsupported else "bad task"
        line = self.failures.redactor.text(error.line())
        self.console.print(Text(f"{kind}: {line}", style="yellow"), soft_wrap=True)

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
