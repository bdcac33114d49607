"""What each step of a multi-step task did (`Task.steps`): its reward, its commands, and whether it ended the
task. A rollout's `steps` lists the steps that ran, in order; its `reward` is the task's `step_reward` of them."""

from __future__ import annotations

from pydantic import Field

from coding_agent_env.models.common import WireModel
from coding_agent_env.models.results import CommandResult

__all__ = ["StepResult"]


class StepResult(WireModel):
    """One step that ran: its agent's exit, its setup and verify, its reward and named metrics."""

    name: str
    agent_exit_code: int | None = None
    agent_timed_out: bool = False
    setup_results: list[CommandResult] = Field(default_factory=list)
    verify_results: list[CommandResult] = Field(default_factory=list)
    reward: float | None = Field(default=None, description="The step's reward, by the task's reward rule.")
    rewards: dict[str, float] | None = Field(default=None, description="The step's named metrics (reward.json).")
    reward_note: str | None = None
    gate: str | None = Field(
        default=None, description="Why the task ended after this step (its `min_reward` not met); null if it did not."
    )
