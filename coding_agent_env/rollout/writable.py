"""The old import path of `workspace.writable` (the `run_rollout` tool's argument check uses it)."""

from coding_agent_env.workspace.writable import check_writable

__all__ = ["check_writable"]
