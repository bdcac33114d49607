"""Trainer-side sessions: OpenEnv's harness contract (`openenv.core.harness`) served by this server, without a
runtime dependency on openenv (duck-typed): interactive episodes for white-box training (`EpisodeSessionFactory`:
the trainer's model acts through the `terminal` tool) and loop-owning rollouts (`RolloutSessionFactory`: a CLI
agent owns its loop, the trainer reads the training trace back). No server dependencies, so it imports where
trainers are (openenv 0.10, TRL, mcp 1.x)."""

from coding_agent_env.harness.episodes import (
    EpisodeSession,
    EpisodeSessionFactory,
    HarnessError,
    HarnessTool,
    ToolResult,
    VerifyResult,
)
from coding_agent_env.harness.rollouts import RolloutSession, RolloutSessionFactory

__all__ = [
    "EpisodeSession",
    "EpisodeSessionFactory",
    "HarnessError",
    "HarnessTool",
    "RolloutSession",
    "RolloutSessionFactory",
    "ToolResult",
    "VerifyResult",
]
