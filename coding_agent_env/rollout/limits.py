"""The old import path of `workspace.limits` (the backend tests use it)."""

from coding_agent_env.workspace.limits import LimitsError, resolve_limits

__all__ = ["LimitsError", "resolve_limits"]
