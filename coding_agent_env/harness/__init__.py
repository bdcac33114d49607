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


def __getattr__(name: str) -> object:
    # The rollout sessions need the training trace (and so aiohttp, a base dependency); the episode sessions need
    # only the standard library and websockets: import the former on first use.
    if name in ("RolloutSession", "RolloutSessionFactory"):
        from coding_agent_env.harness import rollouts

        return getattr(rollouts, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
