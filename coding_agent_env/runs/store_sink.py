"""A batch's way into the results store: each finished record added under the batch's run id, and a tally of
what the store acknowledged and what it did not, row by row, so `run` says which rollouts the store lacks and
exits non-zero (`runs.command`). Nothing is retried: a refused row is in the batch's JSONL journal, which is
written first (`batch._write`), and `runs.command` names it."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from coding_agent_env.runs.journal import Record
from coding_agent_env.runs.store import ResultsStore
from coding_agent_env.runs.store_errors import ResultsStoreError

__all__ = ["MAX_REFUSAL_LINES", "Refusal", "StoreSink"]

log = logging.getLogger(__name__)

MAX_REFUSAL_LINES = 20
"""Rows the end summary names one by one; the rest are counted (memory bounded whatever the batch's size)."""
MAX_REASON_CHARS = 200
"""Characters of each refusal's reason."""


@dataclass(frozen=True)
class Refusal:
    """One row the store did not acknowledge."""

    task_id: str
    attempt: int
    rollout_id: str
    reason: str


@dataclass
class StoreSink:
    """A `RecordSink` adding each record to `store` under `run_id`. `add` never raises for the store's sake: a
    row the store refused (or could not be reached for) is counted and kept (`refusals`, the first
    `MAX_REFUSAL_LINES`), and logged as one line."""

    store: ResultsStore
    run_id: str
    handed: int = 0
    acknowledged: int = 0
    refusals: list[Refusal] = field(default_factory=list)

    @property
    def missing(self) -> int:
        """Rows handed over that the store did not acknowledge."""
        return self.handed - self.acknowledged

    def add(self, record: Record) -> None:
        self.handed += 1
        try:
            self.store.add(self.run_id, record)
        except ResultsStoreError as exc:
            reason = str(exc)
        except Exception as exc:  # noqa: BLE001 - not the store's own refusal (a bug): still this row's loss
            log.exception("results store: %r attempt %d raised", record.task_id, record.attempt)
            reason = f"{type(exc).__name__}: {exc}"
        else:
            self.acknowledged += 1
            return
        reason = " ".join(reason.split())[:MAX_REASON_CHARS]
        log.warning("results store: %r attempt %d (rollout %s) not stored: %s", record.task_id, record.attempt,
                    record.result.rollout_id, reason)
        if len(self.refusals) < MAX_REFUSAL_LINES:
            self.refusals.append(Refusal(record.task_id, record.attempt, record.result.rollout_id, reason))

    def lines(self, journal: str) -> list[str]:
        """The end summary's lines about the rows the store lacks (empty when it has them all): a heading, one
        line per row (its task id as a Python literal: it may hold any character), `... and N more`."""
        if not self.missing:
            return []
        out = [f"not in the results store: {self.missing} of {self.handed} rollouts (each is in {journal})"]
        out += [f"  {refusal.task_id!r} #{refusal.attempt} (rollout {refusal.rollout_id!r}): {refusal.reason}"
                for refusal in self.refusals]
        if self.missing > len(self.refusals):
            out.append(f"  ... and {self.missing - len(self.refusals)} more")
        return out
