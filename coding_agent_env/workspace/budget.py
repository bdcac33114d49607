"""Deadlines, named. Each stage has one; the rollout's is their sum, so no inner budget exceeds the outer."""

from __future__ import annotations

from dataclasses import dataclass

from coding_agent_env.models import Task
from coding_agent_env.settings import Settings

__all__ = ["Budget", "STAGE_SLACK_S"]

STAGE_SLACK_S = 5.0
"""Added to each command stage on top of its commands' own timeouts, for spawning and bookkeeping."""


@dataclass(frozen=True)
class Budget:
    """Seconds allowed per stage."""

    provision_s: float
    setup_s: float
    agent_s: float
    verify_s: float
    collect_s: float
    teardown_s: float

    @classmethod
    def for_request(cls, request: Task, settings: Settings) -> Budget:
        per_command = request.command_timeout_s
        # A multi-step task's stages run once per step: each stage's deadline is the sum of its steps' (an outer
        # bound: each step's agent still has its own deadline).
        steps = [request.for_step(step) for step in request.steps] or [request]
        setups = len(request.setup) * bool(request.steps) + sum(len(step.setup) for step in steps)
        # A clean room is a second sandbox, set up again before verify runs in it.
        clean_room_s = (settings.provision_timeout_s + setups * per_command) * len(steps) if request.artifacts else 0.0
        setup_s = setups * per_command + STAGE_SLACK_S * len(steps)
        return cls(
            # A group member's provisioning may wait for its group's template (a sandbox, the setup and the
            # snapshot, made once), then forks its own sandbox.
            provision_s=settings.provision_timeout_s * (2 if request.group_id is not None else 1)
            + (setup_s if request.group_id is not None else 0.0),
            setup_s=setup_s,
            agent_s=sum(step.agent_timeout_s for step in steps) + STAGE_SLACK_S * len(steps),
            verify_s=sum(len(step.verify) for step in steps) * per_command + STAGE_SLACK_S * len(steps) + clean_room_s,
            collect_s=settings.collect_timeout_s,
            teardown_s=settings.teardown_timeout_s,
        )

    @property
    def total_s(self) -> float:
        return (
            self.provision_s + self.setup_s + self.agent_s + self.verify_s + self.collect_s + self.teardown_s
        )
