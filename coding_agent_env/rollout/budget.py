"""The old import path of `workspace.budget` (the client and the backend tests use it)."""

from coding_agent_env.workspace.budget import STAGE_SLACK_S, Budget

__all__ = ["STAGE_SLACK_S", "Budget"]
