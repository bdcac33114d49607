"""The table of tools: every tool declared once, shared by WS / HTTP step, JSON-RPC, MCP and the web tab.

    run_rollout     always                       RolloutRequest -> RolloutResult
    start_episode   MCP only (reset elsewhere)   reset's task fields -> the episode's opening observation
    terminal        while the episode lives      TerminalCall -> TerminalResult | EpisodeReport
    keystrokes      while the episode lives      KeystrokesCall -> TerminalResult (a live shell's)

A new tool is one module (a `Tool`) and one line in `TOOLS`; each door adapts a `ToolReply` in one place.
"""

from __future__ import annotations

import functools
from typing import Any

from coding_agent_env.api.tools.base import Tool
from coding_agent_env.api.tools.episode import StartEpisode
from coding_agent_env.api.tools.keystrokes import Keystrokes
from coding_agent_env.api.tools.rollout import RunRollout
from coding_agent_env.api.tools.terminal import Terminal

__all__ = ["KEYSTROKES", "ROLLOUT", "START_EPISODE", "TERMINAL", "TOOLS", "listing", "openenv_tool"]

ROLLOUT = RunRollout()
TERMINAL = Terminal()
KEYSTROKES = Keystrokes()


@functools.cache
def listing(schema_key: str, live_episode: bool) -> list[dict[str, Any]]:
    """The descriptors OpenEnv's paths list, in table order (`schema_key`: `input_schema` on the step path,
    `inputSchema` over JSON-RPC). Built once per variant; callers must not mutate it."""
    return [tool.descriptor(schema_key) for tool in TOOLS if tool.openenv and tool.offered(live_episode)]


START_EPISODE = StartEpisode(lambda live: listing("input_schema", live))
TOOLS: tuple[Tool[Any], ...] = (ROLLOUT, START_EPISODE, TERMINAL, KEYSTROKES)
"""In the order MCP lists them (OpenEnv's paths list run_rollout, then terminal and keystrokes)."""


def openenv_tool(name: str) -> Tool[Any] | None:
    """The tool OpenEnv's paths call by this name, or None (unknown there)."""
    return next((tool for tool in TOOLS if tool.openenv and tool.name == name), None)
