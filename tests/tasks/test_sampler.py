"""Task samplers (`tasks.sampler`) on a simulated task set with known pass rates: the curriculum favours tasks
whose groups carry signal, every sampler resumes exactly from its state, and the signal formula."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from coding_agent_env.tasks.sampler import Curriculum, Sequential, make_sampler, signal

PASS_RATES = {"always": 1.0, "never": 0.0, "half": 0.5, "often": 0.8, "rarely": 0.2}


def simulate(sampler: Curriculum, draws: int, seed: int = 7) -> Counter[str]:
    """Draw tasks and feed back outcomes drawn at each task's true pass rate (each attempt 1 s)."""
    world = random.Random(seed)
    ids = list(PASS_RATES)
    counts: Counter[str] = Counter()
    for _ in range(draws):
        task = ids[sampler.choose(ids)]
        counts[task] += 1
        sampler.observe(task, 1.0 if world.random() < PASS_RATES[task] else 0.0, 1.0)
    return counts


def test_the_curriculum_favours_tasks_near_one_half() -> None:
    counts = simulate(Curriculum(seed=1, group_size=8), 4000)
    assert counts["half"] > 4 * counts["always"] and counts["half"] > 4 * counts["never"], counts
    assert counts["always"] > 0 and counts["never"] > 0  # the floor: no task starves
    assert counts["half"] >= counts["often"] >= counts["always"]


def test_every_sampler_resumes_exactly_from_its_state() -> None:
    ids = list(PASS_RATES)
    for kind in ("uniform", "sequential", "curriculum"):
        sampler = make_sampler(kind, seed=3)
        for _ in range(50):
            sampler.observe(ids[sampler.choose(ids)], 1.0, 2.0)
        state = json.loads(json.dumps(sampler.state_dict()))  # a checkpoint is JSON
        expected = [sampler.choose(ids) for _ in range(30)]
        resumed = make_sampler(kind)
        resumed.load_state_dict(state)
        assert [resumed.choose(ids) for _ in range(30)] == expected, kind
    with pytest.raises(ValueError, match="cannot load"):
        Sequential().load_state_dict(make_sampler("uniform").state_dict())
    with pytest.raises(ValueError, match="unknown task sampler"):
        make_sampler("greedy")


def test_signal_and_costs() -> None:
    assert signal(0.0, 8) == signal(1.0, 8) == 0.0 and signal(0.5, 2) == 0.5
    assert signal(0.5, 8) == pytest.approx(1 - 2 / 256)
    cheap_and_dear = Curriculum(seed=0, group_size=4)
    for _ in range(10):  # both pass half the time; one costs ten times the other
        for task, seconds in (("cheap", 1.0), ("dear", 10.0)):
            cheap_and_dear.observe(task, 1.0, seconds)
            cheap_and_dear.observe(task, 0.0, seconds)
    cheap, dear = cheap_and_dear.weights(["cheap", "dear"])
    assert cheap == pytest.approx(10 * dear)
    unscored = Curriculum()
    unscored.observe("x", None, 5.0)
    assert unscored.stats == {}
