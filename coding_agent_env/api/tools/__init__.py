"""The tools every door offers, declared once (`table.TOOLS`): each validates its arguments in one place and
answers a `ToolReply`, serialised once. Below the doors (`api.protocols`, `api.ui`); imports no door."""

from coding_agent_env.api.tools.base import ArgumentsError, Tool, ToolCallFailed
from coding_agent_env.api.tools.reply import Serialised, ToolReply
from coding_agent_env.api.tools.table import ROLLOUT, START_EPISODE, TERMINAL, TOOLS, listing, openenv_tool

__all__ = [
    "ROLLOUT",
    "START_EPISODE",
    "TERMINAL",
    "TOOLS",
    "ArgumentsError",
    "Serialised",
    "Tool",
    "ToolCallFailed",
    "ToolReply",
    "listing",
    "openenv_tool",
]
