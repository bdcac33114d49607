"""The batch's arithmetic and its journal, without sandboxes."""

from __future__ import annotations

import math
from pathlib import Path

from coding_agent_env.models import RolloutResult, RolloutStatus, Timings
from coding_agent_env.runs.journal import Journal, Record, read_records
from coding_agent_env.runs.stats import Summary, pass_at_k, percentile


def result(reward: float | None, status: RolloutStatus = RolloutStatus.COMPLETED, total: float = 1.0) -> RolloutResult:
    return RolloutResult(rollout_id="r", agent="oracle", sandbox="local", status=status, reward=reward,
                         timings=Timings(total_s=total))


def test_pass_at_k_unbiased() -> None:
    assert pass_at_k(5, 0, 1) == 0.0 and pass_at_k(5, 5, 3) == 1.0
    assert math.isclose(pass_at_k(4, 1, 1), 0.25)
    assert math.isclose(pass_at_k(4, 1, 2), 1 - math.comb(3, 2) / math.comb(4, 2))  # 0.5
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5 and percentile([], 0.9) == 0.0


def test_summary_keeps_infra_errors_apart() -> None:
    summary = Summary()
    summary.add("a", result(1.0))
    summary.add("a", result(0.0))
    summary.add("b", result(None, RolloutStatus.INFRA_ERROR))
    summary.add("b", result(0.5))
    data = summary.as_dict(2)
    assert data["scored"] == 3 and data["infra_errors"] == 1 and data["passed"] == 1
    assert data["mean_reward"] == 0.5  # (1 + 0 + 0.5) / 3: the infra error is not a 0
    assert data["pass@1"] == (0.5 + 0.0) / 2
    assert data["pass@2"] == 1.0  # only task a has two scored attempts


def test_journal_resumes_and_cuts_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    journal = Journal(path)
    journal.open()
    journal.append(Record("t1", 1, result(1.0)))
    journal.close()
    with path.open("a") as handle:
        handle.write('{"task_id": "t1", "attempt": 2, "res')  # a crash mid-write
    assert [r.key for r in read_records(path)] == [("t1", 1)]
    again = Journal(path)
    again.open()
    again.append(Record("t2", 1, result(0.0)))
    again.close()
    assert [r.key for r in read_records(path)] == [("t1", 1), ("t2", 1)]
    assert all(line.endswith("}") for line in path.read_text().splitlines())


def test_phase_times_are_sampled_within_a_bound() -> None:
    from coding_agent_env.runs import stats

    summary = Summary()
    for i in range(stats.TIMING_SAMPLES * 2):
        summary.add(f"t{i}", result(1.0, total=float(i % 100)))
    assert all(len(values) == stats.TIMING_SAMPLES for values in summary.phases.values())
    assert 40 <= summary.as_dict(1)["phases"]["total_s"]["p50"] <= 60  # type: ignore[index]
    assert summary.rollouts == stats.TIMING_SAMPLES * 2
