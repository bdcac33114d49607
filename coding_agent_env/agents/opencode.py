"""OpenCode 1.18.33 (npm `opencode-ai`), as a `CliAgentSpec`.

Configured without touching the workspace: `OPENCODE_CONFIG_CONTENT` declares one openai-compatible provider
pointing at the relay (the token is its api key, in the environment only), every permission allowed,
snapshots, sharing and autoupdate off; `OPENCODE_DISABLE_MODELS_FETCH=1`; `--title` so no extra title call
is made. Its plugin package (`@opencode-ai/plugin`, which it would otherwise fetch on first run) is
pre-installed in the prefix and linked into `$HOME/.config/opencode`. `opencode run --format json` prints
JSONL events: `step_start`, `tool_use`, `text`, `step_finish`, `error`.
"""

from __future__ import annotations

import json

from coding_agent_env.agents.event_stream import AgentReport, json_lines
from coding_agent_env.agents.spec import CliAgentSpec, HomeLink, Launch, LaunchContext, NpmInstall, NpmPackage

__all__ = ["OPENCODE", "parse_opencode_events"]

VERSION = "1.18.33"
PROVIDER = "relay"
CONTEXT_TOKENS = 128_000
OUTPUT_TOKENS = 16_384


def opencode_config(ctx: LaunchContext) -> dict[str, object]:
    model = {"name": ctx.model, "tool_call": True, "limit": {"context": CONTEXT_TOKENS, "output": OUTPUT_TOKENS}}
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "name": PROVIDER,
        "options": {"baseURL": ctx.base_url, "apiKey": ctx.token},
        "models": {ctx.model: model},
    }
    return {
        "$schema": "https://opencode.ai/config.json",
        "provider": {PROVIDER: provider},
        "model": f"{PROVIDER}/{ctx.model}",
        "autoupdate": False,
        "share": "disabled",
        "snapshot": False,
        "permission": {"*": "allow"},
    }


def render(ctx: LaunchContext) -> Launch:
    env = {
        "OPENCODE_CONFIG_CONTENT": json.dumps(opencode_config(ctx)),
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "npm_config_update_notifier": "false",
    }
    argv = (f"{ctx.prefix}/node_modules/.bin/opencode", "run", "--format", "json", "--title", ctx.title)
    links = (
        HomeLink("plugin/node_modules", ".config/opencode/node_modules"),
        HomeLink("plugin/package.json", ".config/opencode/package.json", copy=True),
        HomeLink("plugin/package-lock.json", ".config/opencode/package-lock.json", copy=True),
    )
    return Launch(argv=argv, env=env, links=links)


def parse_opencode_events(text: str) -> AgentReport:
    """Total: any text gives a report (see `events.json_lines` for the bounds)."""
    report = AgentReport()
    for event in json_lines(text, report):
        kind = event.get("type")
        part = event.get("part")
        part = part if isinstance(part, dict) else {}
        if kind == "step_start":
            report.steps += 1
        elif kind == "tool_use":
            state = part.get("state")
            report.add_tool(part.get("tool"), state.get("input") if isinstance(state, dict) else None)
        elif kind == "text":
            report.add_text(part.get("text"))
        elif kind == "step_finish":
            tokens = part.get("tokens")
            total = tokens.get("total") if isinstance(tokens, dict) else None
            report.tokens += total if isinstance(total, int) and total > 0 else 0
        elif kind == "error":
            report.add_error(event.get("error"))
    return report


OPENCODE = CliAgentSpec(
    name="opencode",
    installs=(
        NpmInstall((NpmPackage("opencode-ai", VERSION),)),
        NpmInstall((NpmPackage("@opencode-ai/plugin", VERSION),), subdir="plugin"),
    ),
    render=render,
    parse_events=parse_opencode_events,
    artifacts=(".local/share/opencode/log",),
)
