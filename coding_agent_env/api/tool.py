"""Kept for code outside the api room that imports these names from here; the tool lives in `api.tools`
(`api.tools.rollout.RunRollout`, entry `ROLLOUT` of the table)."""

from __future__ import annotations

from typing import Any

from coding_agent_env.api.tools import ROLLOUT, ToolCallFailed
from coding_agent_env.api.tools.rollout import TOOL_DESCRIPTION, TOOL_NAME
from coding_agent_env.models import RolloutRequest

__all__ = ["TOOL_DESCRIPTION", "TOOL_NAME", "ToolCallFailed", "parse_arguments"]


def parse_arguments(name: str, arguments: Any) -> RolloutRequest:
    """`run_rollout`'s arguments as a request, or ToolCallFailed (`tool_not_found` for another name)."""
    if name != TOOL_NAME:
        raise ToolCallFailed("tool_not_found", f"Unknown tool: '{name}'")
    return ROLLOUT.parse(arguments)
