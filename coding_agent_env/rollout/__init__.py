"""The rollout pipeline: RolloutRequest in, RolloutResult out."""

from coding_agent_env.rollout.pipeline import run_rollout

__all__ = ["run_rollout"]
