"""Typed progress events a rollout emits through the caller's `emit` callable, in order.

Every event carries the `rollout_id` and a `type` discriminator; `RolloutEvent` is their tagged union
(parse with `EVENT_ADAPTER.validate_python`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from coding_agent_env.models import CommandResult, RolloutStatus

__all__ = [
    "AgentFinished",
    "CommandFinished",
    "EVENT_ADAPTER",
    "Emit",
    "PhaseFinished",
    "PhaseStarted",
    "Phase",
    "Provisioned",
    "RolloutEvent",
    "RolloutFinished",
    "RolloutStarted",
]

Phase = Literal["provision", "setup", "agent", "verify", "collect", "teardown"]


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    rollout_id: str


class RolloutStarted(_Event):
    type: Literal["rollout_started"] = "rollout_started"
    agent: str
    sandbox: str


class PhaseStarted(_Event):
    type: Literal["phase_started"] = "phase_started"
    phase: Phase


class PhaseFinished(_Event):
    type: Literal["phase_finished"] = "phase_finished"
    phase: Phase
    duration_s: float


class Provisioned(_Event):
    type: Literal["provisioned"] = "provisioned"
    sandbox_id: str
    isolation: str


class CommandFinished(_Event):
    type: Literal["command_finished"] = "command_finished"
    phase: Literal["setup", "verify"]
    index: int
    result: CommandResult


class AgentFinished(_Event):
    type: Literal["agent_finished"] = "agent_finished"
    exit_code: int | None
    timed_out: bool


class RolloutFinished(_Event):
    type: Literal["rollout_finished"] = "rollout_finished"
    status: RolloutStatus
    reward: float | None


RolloutEvent = Annotated[
    RolloutStarted | PhaseStarted | PhaseFinished | Provisioned | CommandFinished | AgentFinished | RolloutFinished,
    Field(discriminator="type"),
]
EVENT_ADAPTER: TypeAdapter[RolloutEvent] = TypeAdapter(RolloutEvent)

Emit = Callable[[RolloutEvent], None]
