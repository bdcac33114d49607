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
        # A clean room is a second sandbox, set up again before verify runs in it.
        clean_room_s = settings.provision_timeout_s + len(request.setup) * per_command if request.artifacts else 0.0
        return cls(
            provision_s=settings.provision_timeout_s,
            setup_s=len(request.setup) * per_command + STAGE_SLACK_S,
            agent_s=request.agent_timeout_s + STAGE_SLACK_S,
            verify_s=len(request.verify) * per_command + STAGE_SLACK_S + clean_room_s,
            collect_s=settings.collect_timeout_s,
            teardown_s=settings.teardown_timeout_s,
        )

    @property
    def total_s(self) -> float:
        return (
            self.provision_s + self.setup_s + self.agent_s + self.verify_s + self.collect_s + self.teardown_s
        )
