"""Trainer-side sessions: OpenEnv's harness contract (`openenv.core.harness`) served by this server, without a
runtime dependency on openenv (duck-typed): interactive episodes for white-box training (`EpisodeSessionFactory`:
the trainer's model acts through the `terminal` tool) and loop-owning rollouts (`RolloutSessionFactory`: a CLI
agent owns its loop, the trainer reads the training trace back); and TRL's `environment_factory` class
(`CodingEnvironment`, `AsyncCodingEnvironment`: reset, the `terminal` tool, get_reward). No server dependencies,
so it imports where trainers are (openenv 0.10, TRL, mcp 1.x)."""

from coding_agent_env.harness.episodes import (
    EpisodeSession,
    EpisodeSessionFactory,
    HarnessTool,
    ToolResult,
    VerifyResult,
)
from coding_agent_env.harness.channel import (
    ConnectionLostError,
    HarnessError,
    ServerRefusedError,
    ServerUnreachableError,
)
from coding_agent_env.harness.servers import NoServerError, ServerPool, server_urls

__all__ = [
    "AsyncCodingEnvironment",
    "CodingEnvironment",
    "ConnectionLostError",
    "EpisodeSession",
    "EpisodeSessionFactory",
    "HarnessError",
    "HarnessTool",
    "NoServerError",
    "RolloutSession",
    "RolloutSessionFactory",
    "ServerPool",
    "ServerRefusedError",
    "ServerUnreachableError",
    "ToolResult",
    "VerifyResult",
    "server_urls",
]

_LAZY = {
    "RolloutSession": "rollouts",
    "RolloutSessionFactory": "rollouts",
    "CodingEnvironment": "environment",
    "AsyncCodingEnvironment": "environment",
}


def __getattr__(name: str) -> object:
    # The rollout sessions need the training trace (and so aiohttp, a base dependency) and TRL's environments the
    # task model (pydantic); the episode sessions need only the standard library and websockets: import the
    # others on first use.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"coding_agent_env.harness.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
