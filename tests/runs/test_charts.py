"""The Runs view's chart tables (`runs.charts`) from known rollouts: what each chart would plot."""

from __future__ import annotations

from coding_agent_env.runs import charts
from coding_agent_env.runs.store import RolloutRow


def row(task: str, reward: float | None, finished: float, status: str = "completed") -> RolloutRow:
    return RolloutRow(f"r-{task}-{finished}", "run", task, 0, "oracle", "local", status, reward, finished, 1.0, "", [])


ROWS = [row("a", 1.0, 60.0), row("a", 0.0, 61.0), row("a", None, 62.0, "infra_error"), row("b", 0.55, 125.0),
        row("b", 1.0, 126.0)]


def test_pass_rate_and_mean_reward_per_task_count_scored_rollouts_only() -> None:
    assert charts.per_task(ROWS) == [
        {"task": "a", "rollouts": 3, "pass rate": 0.5, "mean reward": 0.5},
        {"task": "b", "rollouts": 2, "pass rate": 0.5, "mean reward": 0.775},
    ]


def test_reward_bins_and_throughput_per_minute() -> None:
    bins = {entry["reward"]: entry["rollouts"] for entry in charts.reward_histogram(ROWS)}
    assert (bins["0.0-0.1"], bins["0.5-0.6"], bins["0.9-1.0"], sum(bins.values())) == (1, 1, 2, 4)
    assert [entry["rollouts"] for entry in charts.throughput(ROWS)] == [3, 2]


def test_phase_percentiles_and_limit_kinds() -> None:
    measured = [(ROWS[0], {"timings": {"setup_s": 1.0, "agent_s": 2.0}, "limits_hit": []}),
                (ROWS[1], {"timings": {"setup_s": 3.0, "agent_s": 4.0},
                           "limits_hit": ["memory limit of 64 MB reached (OOM kill)", "process limit (pids) of 8"]}),
                (ROWS[3], {"timings": {}, "limits_hit": ["disk quota exceeded: the sandbox's disk budget of 1 MB",
                                                       "something new"]})]
    phases = {entry["phase"]: entry for entry in charts.phase_times(measured)}
    assert phases["setup"] == {"phase": "setup", "p50 s": 2.0, "p90 s": 2.8} and phases["verify"]["p50 s"] == 0.0
    assert {e["limit"]: e["rollouts"] for e in charts.limits(measured)} == {"memory": 1, "pids": 1, "disk": 1,
                                                                            "other": 1}
