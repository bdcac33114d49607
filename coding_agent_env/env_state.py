"""`EnvState`: a session's `state`, one model for the server that answers it and the client that reads it.

OpenEnv's State (`episode_id`, `step_count`) plus this environment's fields. Extra keys are allowed both ways: a
session holding an interactive episode adds `episode` (its report), and OpenEnv's clients keep what they do not
know. The model's JSON schema is `GET /schema`'s `state` (its docstring is that schema's description: keep it).
Pydantic only: the client imports it where trainers are.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, NonNegativeInt

__all__ = ["EnvState"]


class EnvState(BaseModel):
    """The `state` reply: OpenEnv's State (episode_id, step_count) plus this environment's fields."""

    model_config = ConfigDict(extra="allow")

    episode_id: str | None = None
    step_count: NonNegativeInt = 0
    rollouts_completed: NonNegativeInt = 0
    last_reward: float | None = None
    last_status: str | None = None
