"""Drivers run by OpenEnv's released clients, each inside its own virtualenv (not by pytest directly).

    python drivers.py MODE BASE_URL     prints one JSON line: what the client saw

This file imports only OpenEnv and the standard library: the virtualenvs do not have coding_agent_env.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

TASK: dict[str, Any] = {
    "instruction": "Create hello.txt containing 'hi'.",
    "agent": "oracle",
    "solution": ["echo hi > hello.txt"],
    "verify": ["grep -qx hi hello.txt"],
}
TIMEOUT_S = 600


def mcp_tool_client(url: str, production: bool) -> dict[str, Any]:
    from openenv.core.mcp_client import MCPToolClient

    client = MCPToolClient(base_url=url, message_timeout_s=TIMEOUT_S)
    if not production:
        client.use_production_mode = False
    with client.sync() as env:
        env.reset(seed=0, episode_id="compat-1")
        names = [tool.name for tool in env.list_tools()]
        out = env.call_tool("run_rollout", **TASK)
        state = env.state()
    return {"names": names, "reward": out["reward"], "status": out["status"],
            "episode_id": state.episode_id, "step_count": state.step_count}


async def mcp_tool_client_async(url: str) -> dict[str, Any]:
    from openenv.core.mcp_client import MCPToolClient

    async with MCPToolClient(base_url=url, message_timeout_s=TIMEOUT_S) as env:
        await env.reset(episode_id="compat-async")
        names = [tool.name for tool in await env.list_tools()]
        out = await env.call_tool("run_rollout", **TASK)
        state = await env.state()
    return {"names": names, "reward": out["reward"], "status": out["status"],
            "episode_id": state.episode_id, "step_count": state.step_count}


def generic_step_loop(url: str) -> dict[str, Any]:
    from openenv.core.generic_client import GenericEnvClient

    with GenericEnvClient(base_url=url, message_timeout_s=TIMEOUT_S).sync() as env:
        env.reset(episode_id="compat-generic")
        listed = env.step({"type": "list_tools"})
        result = env.step({"type": "call_tool", "tool_name": "run_rollout", "arguments": TASK})
        state = env.state()
    data = result.observation["result"]["data"]
    names = [tool["name"] for tool in listed.observation["tools"]]
    return {"names": names, "reward": data["reward"], "status": data["status"], "step_reward": result.reward,
            "episode_id": state["episode_id"], "step_count": state["step_count"],
            "rollouts_completed": state["rollouts_completed"]}


def main() -> None:
    mode, url = sys.argv[1], sys.argv[2]
    if mode == "mcp-production":
        out = mcp_tool_client(url, production=True)
    elif mode == "mcp-ws":
        out = mcp_tool_client(url, production=False)
    elif mode == "mcp-async":
        out = asyncio.run(mcp_tool_client_async(url))
    elif mode == "generic":
        out = generic_step_loop(url)
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
