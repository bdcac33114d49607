"""Kept for code outside the api room that imports the step path from here; it lives in `api.protocols.step`."""

from coding_agent_env.api.protocols.step import parse_action, reset, step

__all__ = ["parse_action", "reset", "step"]
