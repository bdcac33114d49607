"""What the Runs view plots, as plain tables (lists of row dicts), from the results store's rollouts: pure
functions, no plotting library (the tab hands them to its charts).

- `per_task`: each task's rollouts, pass rate (reward 1 among scored rollouts) and mean reward;
- `reward_histogram`: scored rollouts by reward, in ten bins of 0.1 (1.0 in the last);
- `phase_times`: p50 and p90 seconds of each phase (provision, setup, agent, verify, collect, teardown);
- `throughput`: rollouts finished per minute, oldest first;
- `limits`: limits hit, by kind (`models.results.limit_kind`: memory, disk, pids, cpu, fsize, other).
Rollouts without a reward (infra errors, cancelled) count in `per_task`'s rollouts and in throughput, never in
a pass rate or a reward bin.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from coding_agent_env.models.results import PHASES, limit_kind
from coding_agent_env.runs.stats import percentile
from coding_agent_env.runs.store import RolloutRow
from coding_agent_env.tasks.sampler import Curriculum, TaskStats, signal

__all__ = ["curriculum_view", "limits", "per_task", "phase_times", "reward_histogram", "throughput"]

_MAX_TASKS = 40

Measured = tuple[RolloutRow, dict[str, Any]]


def per_task(rows: Iterable[RolloutRow]) -> list[dict[str, Any]]:
    """The most-run tasks (at most 40), most rollouts first."""
    rollouts: Counter[str] = Counter()
    scored: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        rollouts[row.task_id] += 1
        if row.reward is not None:
            scored[row.task_id].append(row.reward)
    table = []
    for task, count in rollouts.most_common(_MAX_TASKS):
        rewards = scored.get(task, [])
        table.append({"task": task or "(no id)", "rollouts": count,
                      "pass rate": round(sum(r >= 1.0 for r in rewards) / len(rewards), 4) if rewards else None,
                      "mean reward": round(sum(rewards) / len(rewards), 4) if rewards else None})
    return table


def reward_histogram(rows: Iterable[RolloutRow]) -> list[dict[str, Any]]:
    bins = Counter(min(int(row.reward * 10), 9) for row in rows if row.reward is not None and 0 <= row.reward <= 1)
    return [{"reward": f"{i / 10:.1f}-{(i + 1) / 10:.1f}", "rollouts": bins.get(i, 0)} for i in range(10)]


def phase_times(measured: Sequence[Measured]) -> list[dict[str, Any]]:
    table = []
    for phase in PHASES:
        values = [float(m.get("timings", {}).get(f"{phase}_s") or 0.0) for _, m in measured]
        values = [v for v in values if v > 0]
        table.append({"phase": phase, "p50 s": round(percentile(values, 0.5), 3) if values else 0.0,
                      "p90 s": round(percentile(values, 0.9), 3) if values else 0.0})
    return table


def throughput(rows: Iterable[RolloutRow]) -> list[dict[str, Any]]:
    minutes = Counter(int(row.finished // 60) for row in rows)
    return [{"minute": time.strftime("%Y-%m-%d %H:%M", time.localtime(minute * 60)), "rollouts": count}
            for minute, count in sorted(minutes.items())]


def limits(measured: Sequence[Measured]) -> list[dict[str, Any]]:
    kinds = Counter(limit_kind(str(text)) for _, m in measured for text in m.get("limits_hit") or [])
    return [{"limit": kind, "rollouts": count} for kind, count in kinds.most_common()]


def curriculum_view(outcomes: Sequence[tuple[str, int, int, int, float]], group_size: int = 8) -> list[dict[str, Any]]:
    """Each task of `ResultsStore.task_outcomes` as the curriculum sampler weighs it: rollouts, scored attempts,
    passes, pass rate under its prior, the signal for a group of `group_size`, mean seconds, and its weight
    normalised over the tasks given (`coding-agent-env tasks stats` prints the same)."""
    curriculum = Curriculum(group_size=group_size)
    for task, _, scored, passes, seconds in outcomes:
        curriculum.stats[task] = TaskStats(scored, passes, seconds)
    weights = curriculum.weights([task for task, *_ in outcomes])
    total = sum(weights) or 1.0
    table = []
    for (task, rollouts, scored, passes, seconds), weight in zip(outcomes, weights):
        p = curriculum.pass_rate(task)
        table.append({"task": task, "rollouts": rollouts, "scored": scored, "passes": passes, "p": round(p, 3),
                      "signal": round(signal(p, group_size), 3),
                      "mean s": round(seconds / scored, 2) if scored else None, "weight": round(weight / total, 4)})
    return table
