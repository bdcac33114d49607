"""A multi-step task's two rules (Harbor's): the gate after a step, and the task's reward from its steps.

    gate(step, min_reward)        why the task ends after `step`, or None: a number gates its `reward`, a mapping
                                  each named metric of its `rewards` (missing, or a step verify could not score,
                                  counts as below)
    step_reward(steps, strategy)  `mean`: each step verified counts once (steps a gate cut off are left out);
                                  `final`: the last step's. With named metrics, each is averaged the same way (a
                                  metric a step lacks counts 0) and the scalar is the mean of the step rewards.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal

from coding_agent_env.models.results import StepResult

__all__ = ["gate", "step_reward", "step_rewards"]


def gate(step: StepResult, min_reward: float | Mapping[str, float] | None) -> str | None:
    if min_reward is None:
        return None
    thresholds = {"reward": float(min_reward)} if isinstance(min_reward, (int, float)) else dict(min_reward)
    for key, threshold in thresholds.items():
        if key == "reward" and (step.rewards is None or key not in step.rewards):
            actual = step.reward
        else:
            actual = (step.rewards or {}).get(key)
        value = -math.inf if actual is None else actual
        if value < threshold:
            shown = "none" if actual is None else f"{actual:g}"
            return f"step {step.name}: {key} {shown} below its min_reward {threshold:g}: the task ends here"
    return None


def step_reward(
    steps: Sequence[StepResult], strategy: Literal["mean", "final"], planned: int
) -> tuple[float | None, str | None]:
    """The task's reward and a note (which steps counted); None when no step was verified."""
    verified = [step for step in steps if step.reward is not None]
    if not verified:
        return None, None
    ran = f"{len(steps)} of {planned} steps ran" + (f" ({steps[-1].gate})" if steps and steps[-1].gate else "")
    if strategy == "final":
        return verified[-1].reward, f"{ran}; reward: step {verified[-1].name}'s (final)"
    mean = sum(step.reward or 0.0 for step in verified) / len(verified)
    return mean, f"{ran}; reward: the mean of {len(verified)} verified steps"


def step_rewards(steps: Sequence[StepResult], strategy: Literal["mean", "final"]) -> dict[str, float] | None:
    """The task's named metrics from its steps' (None when no step had any)."""
    named = [step for step in steps if step.rewards]
    if not named:
        return None
    if strategy == "final":
        return dict(named[-1].rewards or {})
    verified = [step for step in steps if step.reward is not None]
    keys = sorted({key for step in named for key in step.rewards or {}})
    return {key: sum((step.rewards or {}).get(key, 0.0) for step in verified) / len(verified) for key in keys}
