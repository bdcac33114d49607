"""Pi 0.73.1 (npm `@mariozechner/pi-coding-agent`), as a `CliAgentSpec`.

`models.json` (0600, it holds the token) in a private agent dir (`PI_CODING_AGENT_DIR`) declares one
provider pointing at the relay with `api: openai-completions` and the compat flags the relay's upstreams
need; `PI_OFFLINE=1`; `pi -p --no-session --mode json` reads its prompt from stdin and prints JSONL events
(`turn_start`, `message_end`, `tool_execution_start`, `agent_end`, ...).
"""

from __future__ import annotations

import json

from coding_agent_env.agents.event_stream import AgentReport, json_lines
from coding_agent_env.agents.spec import AgentFile, CliAgentSpec, Launch, LaunchContext, NpmInstall, NpmPackage

__all__ = ["PI", "parse_pi_events"]

VERSION = "0.73.1"
PROVIDER = "relay"
CONTEXT_TOKENS = 128_000
OUTPUT_TOKENS = 16_384


def models_json(ctx: LaunchContext) -> str:
    provider = {
        "baseUrl": ctx.base_url,
        "api": "openai-completions",
        "apiKey": ctx.token,
        "compat": {"supportsDeveloperRole": False, "supportsReasoningEffort": False},
        "models": [{"id": ctx.model, "contextWindow": CONTEXT_TOKENS, "maxTokens": OUTPUT_TOKENS}],
    }
    return json.dumps({"providers": {PROVIDER: provider}}, indent=2)


def render(ctx: LaunchContext) -> Launch:
    config_dir = f"{ctx.agent_dir}/pi"
    env = {"PI_CODING_AGENT_DIR": config_dir, "PI_OFFLINE": "1", "PI_SKIP_VERSION_CHECK": "1"}
    argv = (
        f"{ctx.prefix}/node_modules/.bin/pi", "-p", "--no-session",
        "--provider", PROVIDER, "--model", ctx.model, "--mode", "json",
    )
    return Launch(argv=argv, env=env, files=(AgentFile(f"{config_dir}/models.json", models_json(ctx)),))


def _message_text(message: dict[str, object]) -> list[str]:
    content = message.get("content")
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return []
    return [c["text"] for c in content if isinstance(c, dict) and c.get("type") == "text" and isinstance(c.get("text"), str)]


def parse_pi_events(text: str) -> AgentReport:
    """Total: any text gives a report (see `events.json_lines` for the bounds)."""
    report = AgentReport()
    for event in json_lines(text, report):
        kind = event.get("type")
        if kind == "turn_start":
            report.steps += 1
        elif kind == "tool_execution_start":
            report.add_tool(event.get("toolName"), event.get("args"))
        elif kind == "message_end":
            message = event.get("message")
            if not isinstance(message, dict) or message.get("role") != "assistant":
                continue
            for part in _message_text(message):
                report.add_text(part)
            if message.get("stopReason") == "error" or message.get("errorMessage"):
                report.add_error(message.get("errorMessage") or "error")
            usage = message.get("usage")
            total = usage.get("totalTokens") if isinstance(usage, dict) else None
            report.tokens += total if isinstance(total, int) and total > 0 else 0
    return report


PI = CliAgentSpec(
    name="pi",
    installs=(NpmInstall((NpmPackage("@mariozechner/pi-coding-agent", VERSION),)),),
    render=render,
    parse_events=parse_pi_events,
)
