"""The batch's summary: mean reward, pass@1 and pass@k (unbiased), infra errors apart, per-phase percentiles.

A rollout without a reward (setup failure, infrastructure error, cancelled) is counted apart and never scored
as 0. A pass is a reward of 1. pass@k per task is the unbiased estimator 1 - C(n-c, k) / C(n, k) over its n
scored attempts with c passes (Chen et al. 2021), averaged over tasks with at least k scored attempts.
"""

from __future__ import annotations

import math
import random
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from coding_agent_env.models import RolloutResult, RolloutStatus
from coding_agent_env.models.results import PHASES as ROLLOUT_PHASES

__all__ = ["PHASES", "Summary", "pass_at_k", "percentile"]

PHASES = (*(f"{phase}_s" for phase in ROLLOUT_PHASES), "total_s")
"""`Timings`' fields a batch summarises (each phase's and the total)."""
TIMING_SAMPLES = 10_000
"""Phase times kept per phase for the percentiles: beyond it, a uniform sample of this size (reservoir), so a
batch of any length summarises in bounded memory."""


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task with `c` passes in `n` attempts (n >= k)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def percentile(values: list[float], q: float) -> float:
    """The `q`-quantile (0..1) by linear interpolation; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass
class Summary:
    """Running totals of a batch; memory grows with the number of tasks, not with the results' size."""

    statuses: Counter[str] = field(default_factory=Counter)
    reward_sum: float = 0.0
    scored: int = 0
    passed: int = 0
    per_task: dict[str, list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))
    """task_id -> [scored attempts, passes]."""
    phases: dict[str, list[float]] = field(default_factory=lambda: {phase: [] for phase in PHASES})
    load_errors: int = 0
    unsupported: int = 0
    _timed: int = 0
    _sampler: random.Random = field(default_factory=lambda: random.Random(0))

    def add(self, task_id: str, result: RolloutResult) -> None:
        self.statuses[result.status.value] += 1
        self._timed += 1
        slot = self._timed - 1 if self._timed <= TIMING_SAMPLES else self._sampler.randrange(self._timed)
        if slot < TIMING_SAMPLES:
            for phase in PHASES:
                samples = self.phases[phase]
                value = getattr(result.timings, phase)
                if slot == len(samples):
                    samples.append(value)
                else:
                    samples[slot] = value
        if result.reward is None:
            return
        counts = self.per_task[task_id]
        counts[0] += 1
        self.scored += 1
        self.reward_sum += result.reward
        if result.reward >= 1.0:
            counts[1] += 1
            self.passed += 1

    @property
    def rollouts(self) -> int:
        return sum(self.statuses.values())

    @property
    def infra_errors(self) -> int:
        """Rollouts without a reward: setup failed, infrastructure error or cancelled."""
        return self.rollouts - self.scored

    @property
    def failed(self) -> int:
        return self.scored - self.passed

    @property
    def mean_reward(self) -> float | None:
        return self.reward_sum / self.scored if self.scored else None

    def pass_at(self, k: int) -> float | None:
        values = [pass_at_k(n, c, k) for n, c in self.per_task.values() if n >= k]
        return sum(values) / len(values) if values else None

    def as_dict(self, k: int) -> dict[str, object]:
        ks = sorted({1, k})
        return {
            "rollouts": self.rollouts, "scored": self.scored, "passed": self.passed, "failed": self.failed,
            "infra_errors": self.infra_errors, "load_errors": self.load_errors, "unsupported": self.unsupported,
            "mean_reward": self.mean_reward, **{f"pass@{n}": self.pass_at(n) for n in ks},
            "statuses": dict(self.statuses),
            "phases": {phase: {"p50": percentile(v, 0.5), "p90": percentile(v, 0.9), "max": max(v, default=0.0)}
                       for phase, v in self.phases.items()},
        }


INVALID = frozenset({RolloutStatus.SETUP_FAILED, RolloutStatus.INFRA_ERROR, RolloutStatus.CANCELLED})
