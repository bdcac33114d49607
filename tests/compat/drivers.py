"""Drivers run by OpenEnv's released clients, each inside its own virtualenv (not by pytest directly).

    python drivers.py MODE BASE_URL     prints one JSON line: what the client saw

With COMPAT_API_TOKEN in the environment, the clients that can carry headers (openenv 0.10's `headers=`) send it
as `X-API-Token`; mode `refused-*` prints how a client without it was refused.

This file imports only OpenEnv and the standard library: the virtualenvs do not have coding_agent_env.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

TASK: dict[str, Any] = {
    "instruction": "Create hello.txt containing 'hi'.",
    "agent": "oracle",
    "solution": ["echo hi > hello.txt"],
    "verify": ["grep -qx hi hello.txt"],
}
TIMEOUT_S = 600
EPISODE: dict[str, Any] = {
    "instruction": "Write 42 to work/answer.txt, then answer 42.",
    "setup_scripts": "mkdir -p work",
    "verify_scripts": ["", 'test "$(cat "$FINAL_ANSWER_FILE")" = 42', "grep -qx 42 work/answer.txt"],
}
COMMAND = "cd work && echo 42 > answer.txt && pwd"


def headers() -> dict[str, Any]:
    """`headers=` for the client when the test gave a caller token; nothing otherwise (openenv-core 0.3 has no
    such parameter)."""
    token = os.environ.get("COMPAT_API_TOKEN")
    return {"headers": {"X-API-Token": token}} if token else {}


def mcp_tool_client(url: str, production: bool) -> dict[str, Any]:
    from openenv.core.mcp_client import MCPToolClient

    client = MCPToolClient(base_url=url, message_timeout_s=TIMEOUT_S, **headers())
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

    async with MCPToolClient(base_url=url, message_timeout_s=TIMEOUT_S, **headers()) as env:
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


def episode_mcp_tool_client(url: str, production: bool) -> dict[str, Any]:
    """An interactive episode as upstream's terminus harness drives it: reset with the task, then `terminal`
    calls with both keys (one empty)."""
    from openenv.core.mcp_client import MCPToolClient

    client = MCPToolClient(base_url=url, message_timeout_s=TIMEOUT_S)
    if not production:
        client.use_production_mode = False
    with client.sync() as env:
        opened = env.reset(episode_id="compat-episode", **EPISODE)
        names = [tool.name for tool in env.list_tools()]
        ran = env.call_tool("terminal", command=COMMAND, final_answer="")
        final = env.call_tool("terminal", command="", final_answer="42")
        state = env.state()
    return {"opened_done": opened.done, "names": names, "ran": ran, "final": final,
            "episode_id": state.episode_id, "step_count": state.step_count}


def episode_generic(url: str) -> dict[str, Any]:
    from openenv.core.generic_client import GenericEnvClient

    with GenericEnvClient(base_url=url, message_timeout_s=TIMEOUT_S).sync() as env:
        opened = env.reset(episode_id="compat-generic-episode", **EPISODE)
        step = {"type": "call_tool", "tool_name": "terminal"}
        ran = env.step({**step, "arguments": {"command": COMMAND, "final_answer": ""}})
        final = env.step({**step, "arguments": {"command": "", "final_answer": "42"}})
        state = env.state()
    return {"opened_done": opened.done, "instruction": opened.observation["instruction"],
            "ran": ran.observation["result"]["data"], "final": final.observation["result"]["data"],
            "reward": final.reward, "done": final.done, "state_episode": state["episode"]}


def task_set_episode(url: str) -> dict[str, Any]:
    """An episode of a task the server holds (`serve --tasks`), named by split and index in `reset`; the task
    (test split, index 1) is "write 4 into n.txt"."""
    from openenv.core.mcp_client import MCPToolClient

    with MCPToolClient(base_url=url, message_timeout_s=TIMEOUT_S).sync() as env:
        opened = env.reset(split="test", index=1)
        env.call_tool("terminal", command="echo 4 > n.txt", final_answer="")
        final = env.call_tool("terminal", command="", final_answer="done")
    return {"opened_done": opened.done, "final": final}


def refused(mode: str, url: str) -> dict[str, Any]:
    """How `mode`'s client fails against a server it carries no (or a wrong) token for."""
    try:
        if mode == "mcp-async":
            asyncio.run(mcp_tool_client_async(url))
        else:
            mcp_tool_client(url, production=mode == "mcp-production")
    except Exception as exc:  # noqa: BLE001 - what the released client raises is what is reported
        return {"refused": True, "error": f"{type(exc).__name__}: {exc}"}
    return {"refused": False}


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
    elif mode == "episode-mcp-production":
        out = episode_mcp_tool_client(url, production=True)
    elif mode == "episode-mcp-ws":
        out = episode_mcp_tool_client(url, production=False)
    elif mode == "episode-generic":
        out = episode_generic(url)
    elif mode == "task-set-episode":
        out = task_set_episode(url)
    elif mode.startswith("refused-"):
        out = refused(mode.removeprefix("refused-"), url)
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
