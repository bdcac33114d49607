"""The batch loop: tasks (streamed) x attempts, run by `concurrency` workers, each finished rollout written to the
journal (and the store) at once, the summary kept as it goes.

Memory stays bounded by the concurrency, not the dataset: tasks are read lazily as workers free up, and results
are written and dropped. Interrupting (Ctrl-C cancels the loop) tears the running rollouts' sandboxes down (the
pipeline's shielded teardown) and loses nothing already finished; a rerun skips the (task_id, attempt) pairs its
journal holds.

Every rollout that starts gets its line: one that raises instead of giving a result (whatever it raises) is
written as that rollout's infra_error result (`executor.failed_result`) and the others go on; a sink (the store)
that fails on one record is logged, and the journal line stays.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from coding_agent_env.models import RolloutRequest
from coding_agent_env.runs.executor import Executor, Refused, failed_result
from coding_agent_env.runs.journal import Journal, Record, read_records
from coding_agent_env.runs.stats import Summary
from coding_agent_env.tasks import LoadedTask, TaskError
from coding_agent_env.tasks.sampler import Sampler

__all__ = ["BatchObserver", "BatchPlan", "Job", "RecordSink", "Sampling", "run_batch"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchPlan:
    attempts: int = 1
    concurrency: int = 1
    overrides: dict[str, Any] = field(default_factory=dict)
    """Request fields set on every task (agent, model, endpoint, base_url, api_key, sandbox)."""
    group_attempts: bool = True
    """With several attempts, a task's attempts are one group (`Task.group_id`, unless the task names its own):
    its setup runs once and every attempt starts from a fork of it, where the backend can fork."""


@dataclass(frozen=True)
class Sampling:
    """`rollouts` draws of `sampler` over the loaded tasks instead of every task x attempts (`run --sampler`): each
    draw is the task's next attempt; each finished rollout is fed back to the sampler (on the loop's thread), and
    so are the journal's earlier records when a run resumes (which count toward `rollouts`). The tasks are held
    in memory (a sampler needs them all)."""

    sampler: Sampler
    rollouts: int


@dataclass(frozen=True)
class Job:
    task: LoadedTask
    attempt: int
    request: RolloutRequest

    @property
    def task_id(self) -> str:
        return self.task.task_id


class BatchObserver(Protocol):
    """What a progress display hears. Called on the loop's thread; must not block."""

    def started(self, job: Job) -> None: ...
    def finished(self, record: Record) -> None: ...
    def skipped(self, record: Record) -> None: ...
    def problem(self, error: TaskError) -> None: ...
    def refused(self, job: Job, error: TaskError) -> None: ...


class RecordSink(Protocol):
    """Where else a finished record goes (the results store)."""

    def add(self, record: Record) -> None: ...


async def run_batch(
    items: Iterable[LoadedTask | TaskError],
    plan: BatchPlan,
    executor: Executor,
    journal: Journal,
    observer: BatchObserver,
    sinks: Iterable[RecordSink] = (),
    sampling: Sampling | None = None,
) -> Summary:
    """Run every attempt of every task not already in the journal (or, with `sampling`, its draws); the summary
    covers the journal's earlier records too. Load errors and refusals go to `observer.problem` and the summary,
    never into the journal."""
    summary = Summary()
    for record in read_records(journal.path):
        journal.done.add(record.key)
        summary.add(record.task_id, record.result)
        observer.skipped(record)
        if sampling is not None:
            sampling.sampler.observe(record.task_id, record.result.reward, record.result.wall_s)
    jobs = (_jobs(items, plan, journal, summary, observer) if sampling is None
            else _sampled_jobs(items, plan, sampling, journal, summary, observer))
    journal.open()
    # One writer thread: records are written in the order they finish, and an fsync or a busy store never
    # stalls the event loop the running rollouts share.
    writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch-writer")
    sinks = list(sinks)

    async def keep(record: Record) -> None:
        await asyncio.get_running_loop().run_in_executor(writer, _write, record, journal, sinks)

    try:
        async with executor:
            learn = sampling.sampler.observe if sampling is not None else None
            workers = [asyncio.ensure_future(_worker(index, jobs, executor, keep, summary, observer, learn))
                       for index in range(plan.concurrency)]
            try:
                await asyncio.gather(*workers)
            finally:
                for worker in workers:
                    worker.cancel()
                await asyncio.gather(*workers, return_exceptions=True)
    finally:
        writer.shutdown(wait=True)  # every record handed over is written before the journal closes
        journal.close()
    return summary


def _write(record: Record, journal: Journal, sinks: list[RecordSink]) -> None:
    journal.append(record)  # a journal that cannot be written stops the batch: nothing after it would be kept
    for sink in sinks:
        try:
            sink.add(record)
        except Exception:  # noqa: BLE001 - the line is in the journal; the store is a copy
            log.exception("batch: %s attempt %d not added to %r", record.task_id, record.attempt, sink)


def _jobs(
    items: Iterable[LoadedTask | TaskError],
    plan: BatchPlan,
    journal: Journal,
    summary: Summary,
    observer: BatchObserver,
) -> Iterator[Job]:
    for item, request in _loaded(items, plan, summary, observer):
        todo = [attempt for attempt in range(1, plan.attempts + 1) if (item.task_id, attempt) not in journal.done]
        if plan.attempts > 1 and plan.group_attempts and request.group_id is None:
            digest = hashlib.sha256(item.task_id.encode("utf-8", "surrogatepass")).hexdigest()[:24]
            # Any task id is a valid group id. The members still to run are all that will come: the template
            # goes as soon as the last has ended.
            request = request.model_copy(update={"group_id": f"attempts-{digest}", "group_size": len(todo) or None})
        for attempt in todo:
            yield Job(item, attempt, request)


def _loaded(
    items: Iterable[LoadedTask | TaskError], plan: BatchPlan, summary: Summary, observer: BatchObserver
) -> Iterator[tuple[LoadedTask, RolloutRequest]]:
    """Each task with its request (the plan's overrides set); load errors and refusals counted and reported."""
    for item in items:
        if isinstance(item, TaskError):
            summary.unsupported += item.unsupported
            summary.load_errors += not item.unsupported
            observer.problem(item)
            continue
        yield item, item.request.model_copy(update=plan.overrides) if plan.overrides else item.request


def _sampled_jobs(
    items: Iterable[LoadedTask | TaskError],
    plan: BatchPlan,
    sampling: Sampling,
    journal: Journal,
    summary: Summary,
    observer: BatchObserver,
) -> Iterator[Job]:
    tasks = list(_loaded(items, plan, summary, observer))
    if not tasks:
        return
    ids = [task.task_id for task, _ in tasks]
    attempts = Counter(task_id for task_id, _ in journal.done)
    for _ in range(max(sampling.rollouts - len(journal.done), 0)):
        task, request = tasks[sampling.sampler.choose(ids)]  # when a worker frees up: what finished is known
        attempts[task.task_id] += 1
        while (task.task_id, attempts[task.task_id]) in journal.done:
            attempts[task.task_id] += 1
        yield Job(task, attempts[task.task_id], request)


async def _worker(
    index: int,
    jobs: Iterator[Job],
    executor: Executor,
    keep: Callable[[Record], Awaitable[None]],
    summary: Summary,
    observer: BatchObserver,
    learn: Callable[[str, float | None, float], None] | None = None,
) -> None:
    for job in jobs:  # shared by the workers: each takes the next job when it is free
        observer.started(job)
        try:
            result = await executor.run(job.task, job.request, index)
        except Refused as exc:
            summary.unsupported += 1
            observer.refused(job, TaskError(job.task.source, f"cannot run here: {exc}", unsupported=True))
            continue
        except Exception as exc:  # noqa: BLE001 - one rollout's failure is its own line; the others go on
            log.exception("batch: %s attempt %d raised instead of giving a result", job.task_id, job.attempt)
            result = failed_result(job.request, exc)
        record = Record(job.task_id, job.attempt, result, job.task.source, job.task.notes)
        # Shielded: a record whose rollout finished is written even when Ctrl-C cancels this worker now.
        await asyncio.shield(keep(record))
        summary.add(record.task_id, result)
        if learn is not None:
            learn(record.task_id, result.reward, result.wall_s)
        observer.finished(record)
