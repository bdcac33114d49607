"""Batch runs: what the batch machinery (task loading, workers, the JSONL journal, the results store, the
summary) costs on top of the pipeline, the store's write cost per rollout, and memory over a long batch.

1. N oracle tasks (the task of `bench/rollout.py`: 1 setup, 1 solution, 2 verify commands) from a JSONL file
   through `run_batch` (journal and store on), against the same N requests through `run_rollout` with the
   backends built once (`bench/rollout.py`'s in-process figure), at concurrency 1, 8 and 32; the two alternate in
   rounds so load elsewhere hits both alike. Target: the machinery costs under 10%.
2. The store's and the journal's write cost per rollout (a real oracle result, appended N times).
3. 10,000 tiny tasks through the batch loop with an instant executor: peak traced memory after 1,000 and after
   10,000 tasks (bounded: tasks and results are streamed, not held).

    .venv/bin/python bench/batch.py [N]   (default 200)
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._common import bench_settings  # noqa: E402
from coding_agent_env.models import RolloutRequest, RolloutResult, RolloutStatus  # noqa: E402
from coding_agent_env.rollout import run_rollout  # noqa: E402
from coding_agent_env.runs.batch import BatchPlan, Job, run_batch  # noqa: E402
from coding_agent_env.runs.command import StoreSink  # noqa: E402
from coding_agent_env.runs.executor import Executor, InProcessExecutor  # noqa: E402
from coding_agent_env.runs.journal import Journal, Record  # noqa: E402
from coding_agent_env.runs.store import ResultsStore  # noqa: E402
from coding_agent_env.sandbox import Backends  # noqa: E402
from coding_agent_env.settings import Settings  # noqa: E402
from coding_agent_env.tasks import LoadedTask, TaskError, iter_tasks  # noqa: E402

COMMANDS = ["echo 1 > a.txt", "echo 2 > b.txt", "grep -qx 1 a.txt", "grep -qx 2 b.txt"]
TASK = {"instruction": "write b.txt", "agent": "oracle", "setup": [COMMANDS[0]], "solution": [COMMANDS[1]],
        "verify": COMMANDS[2:]}
ROUNDS = 3


class Quiet:
    """A `BatchObserver` that only counts (the live display's own cost is a few redraws a second)."""

    def __init__(self) -> None:
        self.finished_count = 0

    def started(self, job: Job) -> None:
        pass

    def finished(self, record: Record) -> None:
        self.finished_count += 1

    def skipped(self, record: Record) -> None:
        pass

    def problem(self, error: TaskError) -> None:
        raise RuntimeError(error.line())

    def refused(self, job: Job, error: TaskError) -> None:
        raise RuntimeError(error.line())


def write_tasks(path: Path, n: int) -> None:
    with path.open("w") as out:
        for i in range(n):
            out.write(json.dumps({**TASK, "task_id": f"t{i}"}) + "\n")


async def reference(settings: Settings, n: int, concurrency: int) -> float:
    """Seconds for n rollouts through `run_rollout` (backends built once), at most `concurrency` at a time."""
    request = RolloutRequest.model_validate(TASK)
    gate = asyncio.Semaphore(concurrency)
    async with Backends(settings) as backends:

        async def one() -> None:
            async with gate:
                result = await run_rollout(request, settings=settings, backends=backends)
                assert result.status is RolloutStatus.COMPLETED and result.reward == 1.0, result.error

        started = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
        return time.perf_counter() - started


async def batched(settings: Settings, tasks: Path, n: int, concurrency: int, work: Path) -> float:
    """Seconds for the same n rollouts through `run_batch` from the JSONL, journal and store on."""
    journal = work / f"out-{time.monotonic_ns()}.jsonl"
    observer = Quiet()
    with ResultsStore(work / "results.sqlite") as store:
        sink = StoreSink(store, store.new_run("bench"))
        started = time.perf_counter()
        summary = await run_batch(iter_tasks([tasks]), BatchPlan(1, concurrency), InProcessExecutor(settings),
                                  Journal(journal), observer, [sink])
        elapsed = time.perf_counter() - started
    assert summary.passed == n and observer.finished_count == n, summary.as_dict(1)
    journal.unlink()
    return elapsed


async def overhead(settings: Settings, n: int, work: Path) -> None:
    tasks = work / "tasks.jsonl"
    write_tasks(tasks, n)
    print(f"1. {n} oracle rollouts: run_batch (JSONL in, journal + store out) against run_rollout, {ROUNDS} rounds")
    for concurrency in (1, 8, 32):
        ours, ref = [], []
        for _ in range(ROUNDS):
            ref.append(await reference(settings, n, concurrency))
            ours.append(await batched(settings, tasks, n, concurrency, work))
        o, r = statistics.median(ours), statistics.median(ref)
        print(f"   concurrency {concurrency:2}: batch {n / o:6.1f} rollouts/s   run_rollout {n / r:6.1f} rollouts/s   "
              f"batch/ref wall {o / r:.3f}x ({(o / r - 1) * 100:+.1f}%)")


async def write_costs(settings: Settings, n: int, work: Path) -> None:
    result = await run_rollout(RolloutRequest.model_validate(TASK), settings=settings)
    size = len(result.model_dump_json())
    with ResultsStore(work / "writes.sqlite") as store:
        run = store.new_run("bench")
        started = time.perf_counter()
        for i in range(n):
            store.add(run, Record(f"t{i}", 1, result.model_copy(update={"rollout_id": f"r{i}"})))
        store_s = (time.perf_counter() - started) / n
    journal = Journal(work / "writes.jsonl")
    journal.open()
    started = time.perf_counter()
    for i in range(n):
        journal.append(Record(f"t{i}", 1, result))
    journal_s = (time.perf_counter() - started) / n
    journal.close()
    print(f"2. per rollout ({size} B result): store write {store_s * 1e6:.0f} us, journal append + fsync "
          f"{journal_s * 1e6:.0f} us")


class Instant(Executor):
    """Answers every rollout at once with a small completed result: the batch loop alone."""

    async def run(self, task: LoadedTask, request: RolloutRequest, worker: int) -> RolloutResult:
        await asyncio.sleep(0)
        return RolloutResult(rollout_id=f"{task.task_id}", task_id=task.task_id, agent="oracle", sandbox="local",
                             status=RolloutStatus.COMPLETED, reward=1.0)


async def memory(work: Path) -> None:
    """The batch loop alone (instant executor; journal and store on): its time per rollout, and its peak traced
    memory over 1,000 and 10,000 tasks."""
    peaks, per_rollout = {}, {}
    for n in (1_000, 10_000):
        tasks = work / f"tiny-{n}.jsonl"
        write_tasks(tasks, n)
        with ResultsStore(work / f"tiny-{n}.sqlite") as store:
            sink = StoreSink(store, store.new_run("bench"))
            tracemalloc.start()
            started = time.perf_counter()
            summary = await run_batch(iter_tasks([tasks]), BatchPlan(1, 32), Instant(),
                                      Journal(work / f"tiny-{n}.out"), Quiet(), [sink])
            per_rollout[n] = (time.perf_counter() - started) / n
            peaks[n] = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        assert summary.passed == n
    print(f"3. batch loop alone (JSONL in, journal + store out, instant rollouts): "
          f"{per_rollout[10_000] * 1e6:.0f} us per rollout (under tracemalloc); peak traced memory "
          f"{peaks[1_000] / 2**20:.1f} MiB at 1,000 tasks, {peaks[10_000] / 2**20:.1f} MiB at 10,000 "
          f"({peaks[10_000] / peaks[1_000]:.2f}x for 10x the tasks: per-task counters and resume keys)")


async def main(n: int) -> None:
    with bench_settings() as settings, tempfile.TemporaryDirectory(prefix="cae-bench-batch-") as tmp:
        work = Path(tmp)
        await overhead(settings, n, work)
        await write_costs(settings, n, work)
        await memory(work)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 200))
