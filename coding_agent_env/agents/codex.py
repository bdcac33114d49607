"""Codex 0.169.0 (npm `@openai/codex`, its native Linux binary), as a `CliAgentSpec`. Dialect: the OpenAI
Responses API, translated by the relay (`llm.dialects.responses`) to the upstream's chat completions.

Configured without touching the workspace: `CODEX_HOME` is a private directory in the agent dir whose
`config.toml` declares one model provider, the relay (`wire_api = "responses"`), reading the rollout's token from
the environment (`env_key`). Every other call Codex would make is off: update checks, analytics (its events
and Statsig metrics), feedback uploads, the plugin and app catalog syncs. The sandbox has no DNS, and Codex's
resolver waits out its timeouts before failing (seconds per rollout), so these are switched off rather than left
to fail. `codex exec --json -` reads the prompt from stdin and prints JSONL
events; `--dangerously-bypass-approvals-and-sandbox` runs every command without a prompt or Codex's own sandbox
(the rollout's sandbox is the boundary); `--skip-git-repo-check` for workdirs that are not repositories.
"""

from __future__ import annotations

import json

from coding_agent_env.agents.event_stream import AgentReport, json_lines
from coding_agent_env.agents.spec import AgentFile, CliAgentSpec, Launch, LaunchContext, NpmInstall, NpmPackage

__all__ = ["CODEX", "parse_codex_events"]

VERSION = "0.169.0"
PACKAGE = "@openai/codex"
BINARY = "@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex"
TOKEN_ENV = "CAE_RELAY_TOKEN"


def config_toml(ctx: LaunchContext) -> str:
    """No secret in it: the provider reads the token from `TOKEN_ENV`."""
    return "\n".join([
        f"model = {json.dumps(ctx.model)}",
        'model_provider = "relay"',
        "check_for_update_on_startup = false",
        "",
        "[analytics]",
        "enabled = false",
        "",
        "[feedback]",
        "enabled = false",
        "",
        "[otel]",
        'metrics_exporter = "none"',
        "",
        "[features]",
        "plugins = false",
        "apps = false",
        "",
        "[model_providers.relay]",
        'name = "relay"',
        f"base_url = {json.dumps(ctx.base_url)}",
        f'env_key = "{TOKEN_ENV}"',
        'wire_api = "responses"',
        "",
    ])


def render(ctx: LaunchContext) -> Launch:
    codex_home = f"{ctx.agent_dir}/codex"
    env = {"CODEX_HOME": codex_home, TOKEN_ENV: ctx.token}
    argv = (
        f"{ctx.prefix}/node_modules/{BINARY}", "exec", "--json", "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox", "--model", ctx.model, "-",
    )
    return Launch(argv=argv, env=env, files=(AgentFile(f"{codex_home}/config.toml", config_toml(ctx), mode=0o644),))


def parse_codex_events(text: str) -> AgentReport:
    """Total: any text gives a report (see `events.json_lines` for the bounds)."""
    report = AgentReport()
    for event in json_lines(text, report):
        kind = event.get("type")
        item = event.get("item") if isinstance(event.get("item"), dict) else {}
        if kind == "item.completed":
            item_type = item.get("type")
            if item_type == "agent_message":
                report.steps += 1
                report.add_text(item.get("text"))
            elif item_type == "command_execution":
                report.steps += 1
                report.add_tool("command_execution", item.get("command"))
            elif item_type in ("file_change", "mcp_tool_call", "web_search"):
                report.add_tool(item_type, item.get("changes") or item.get("tool") or item.get("query"))
            elif item_type == "error":
                report.add_error(item.get("message"))
        elif kind in ("turn.failed", "error"):
            error = event.get("error") if isinstance(event.get("error"), dict) else event
            report.add_error(error.get("message") or kind)
        elif kind == "turn.completed":
            usage = event.get("usage") if isinstance(event.get("usage"), dict) else {}
            for key in ("input_tokens", "output_tokens"):
                value = usage.get(key)
                report.tokens += value if isinstance(value, int) and value > 0 else 0
    return report


CODEX = CliAgentSpec(
    name="codex",
    installs=(NpmInstall((NpmPackage(PACKAGE, VERSION),)),),
    render=render,
    parse_events=parse_codex_events,
)
