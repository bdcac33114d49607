"""Which task of a split to run next: uniform, sequential, or a curriculum that favours tasks whose GRPO groups
still carry signal.

A group of G rollouts of one task teaches only when its rewards differ. For a task passed with probability p, the
chance that a group of G is not all-pass nor all-fail is `1 - p**G - (1 - p)**G`: 0 for tasks always or never
solved, highest at p = 0.5. `Curriculum` samples each task with a weight of that chance per unit of cost (its
mean seconds), with p from the task's observed passes and attempts under a Beta prior (unseen tasks get the
prior's p, 0.5 by default: worth trying), and a floor so no task is starved (a solved task may regress).

Every sampler is a plain object with `choose(task_ids) -> index`, `observe(task_id, reward, seconds)` and
`state_dict()` / `load_state_dict()` (JSON-able: a trainer's checkpoint resumes it exactly, its random stream
included). `make_sampler(kind)` builds one by name.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["SAMPLERS", "Curriculum", "Sampler", "Sequential", "TaskStats", "Uniform", "make_sampler", "signal"]


def signal(p: float, group_size: int) -> float:
    """The chance a group of `group_size` rollouts of a task passed with probability `p` has differing rewards."""
    return max(0.0, 1.0 - p ** group_size - (1.0 - p) ** group_size)


@dataclass
class TaskStats:
    """What was seen of one task: scored attempts, passes (reward 1), and their total seconds."""

    attempts: int = 0
    passes: int = 0
    seconds: float = 0.0


class Sampler:
    """Uniform at random (the base; see the module docstring for the contract)."""

    kind = "uniform"

    def __init__(self, seed: int | None = None) -> None:
        self.rng = random.Random(seed)

    def choose(self, task_ids: Sequence[str]) -> int:
        if not task_ids:
            raise ValueError("no tasks to choose from")
        return self.rng.randrange(len(task_ids))

    def observe(self, task_id: str, reward: float | None, seconds: float = 0.0) -> None:
        """A finished rollout or episode of `task_id` (None reward: unscored, not counted)."""

    def state_dict(self) -> dict[str, Any]:
        version, internal, gauss = self.rng.getstate()
        return {"kind": self.kind, "rng": [version, list(internal), gauss]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("kind") != self.kind:
            raise ValueError(f"a {state.get('kind')!r} sampler's state cannot load into a {self.kind!r} sampler")
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))


Uniform = Sampler


class Sequential(Sampler):
    """Each task in turn, from the first, round and round."""

    kind = "sequential"

    def __init__(self, seed: int | None = None) -> None:
        super().__init__(seed)
        self.next = 0

    def choose(self, task_ids: Sequence[str]) -> int:
        if not task_ids:
            raise ValueError("no tasks to choose from")
        index = self.next % len(task_ids)
        self.next = index + 1
        return index

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "next": self.next}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.next = int(state["next"])


class Curriculum(Sampler):
    """Weight `signal(p, group_size) / cost` per task (see the module docstring), at least `floor` of the largest
    weight. `prior` is the Beta prior (passes, failures) added to each task's counts; a task's cost is its mean
    seconds, or the mean over all tasks seen (1 s before any) when it has none."""

    kind = "curriculum"

    def __init__(self, seed: int | None = None, *, group_size: int = 8, prior: tuple[float, float] = (1.0, 1.0),
                 floor: float = 0.05) -> None:
        super().__init__(seed)
        if group_size < 2:
            raise ValueError("a group has at least 2 members")
        self.group_size = group_size
        self.prior = prior
        self.floor = floor
        self.stats: dict[str, TaskStats] = {}

    def pass_rate(self, task_id: str) -> float:
        seen = self.stats.get(task_id, TaskStats())
        a, b = self.prior
        return (seen.passes + a) / (seen.attempts + a + b)

    def weights(self, task_ids: Sequence[str]) -> list[float]:
        timed = [s.seconds / s.attempts for s in self.stats.values() if s.attempts and s.seconds > 0]
        default_cost = sum(timed) / len(timed) if timed else 1.0
        raw = []
        for task_id in task_ids:
            seen = self.stats.get(task_id)
            cost = seen.seconds / seen.attempts if seen and seen.attempts and seen.seconds > 0 else default_cost
            raw.append(signal(self.pass_rate(task_id), self.group_size) / max(cost, 1e-3))
        top = max(raw, default=0.0)
        return [max(w, self.floor * top) if top > 0 else 1.0 for w in raw]

    def choose(self, task_ids: Sequence[str]) -> int:
        if not task_ids:
            raise ValueError("no tasks to choose from")
        return self.rng.choices(range(len(task_ids)), weights=self.weights(task_ids))[0]

    def observe(self, task_id: str, reward: float | None, seconds: float = 0.0) -> None:
        if reward is None:
            return
        seen = self.stats.setdefault(task_id, TaskStats())
        seen.attempts += 1
        seen.passes += reward >= 1.0
        seen.seconds += max(seconds, 0.0)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "group_size": self.group_size, "prior": list(self.prior), "floor": self.floor,
                "stats": {task: [s.attempts, s.passes, s.seconds] for task, s in self.stats.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.group_size = int(state["group_size"])
        self.prior = (float(state["prior"][0]), float(state["prior"][1]))
        self.floor = float(state["floor"])
        self.stats = {task: TaskStats(int(a), int(p), float(s)) for task, (a, p, s) in state["stats"].items()}


SAMPLERS: dict[str, type[Sampler]] = {"uniform": Sampler, "sequential": Sequential, "curriculum": Curriculum}


def make_sampler(kind: str, seed: int | None = None, **options: Any) -> Sampler:
    """A sampler by name (`SAMPLERS`); `ValueError` for an unknown one."""
    try:
        cls = SAMPLERS[kind]
    except KeyError:
        raise ValueError(f"unknown task sampler {kind!r} (known: {', '.join(SAMPLERS)})") from None
    return cls(seed, **options)
