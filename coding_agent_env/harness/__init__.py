"""Trainer-side sessions: OpenEnv's harness contract (`openenv.core.harness`) served by this server's
interactive episodes, without a runtime dependency on openenv (duck-typed). Standard library and `websockets`
only, so it imports where trainers are (openenv 0.10, TRL, mcp 1.x)."""

from coding_agent_env.harness.episodes import (
    EpisodeSession,
    EpisodeSessionFactory,
    HarnessError,
    HarnessTool,
    ToolResult,
    VerifyResult,
)

__all__ = ["EpisodeSession", "EpisodeSessionFactory", "HarnessError", "HarnessTool", "ToolResult", "VerifyResult"]
