"""Claude Code 2.1.331 (npm `@anthropic-ai/claude-code`, its native Linux binary), as a `CliAgentSpec`. Dialect:
Anthropic Messages, translated by the relay (`llm.dialects.anthropic`) to the upstream's chat completions.

Configured by environment only: `ANTHROPIC_BASE_URL` (the relay's root; the CLI appends `/v1/messages`) and
`ANTHROPIC_AUTH_TOKEN` (the rollout's token, sent as a bearer token), with every non-essential request
(telemetry, error reporting, update checks) off. `claude -p --output-format stream-json --verbose` reads the
prompt from stdin and prints its events; `--dangerously-skip-permissions` runs every tool without a prompt
(`IS_SANDBOX=1`: the CLI refuses that flag as root otherwise, and it does run in a sandbox).
"""

from __future__ import annotations

from coding_agent_env.agents.spec import CliAgentSpec, Launch, LaunchContext, NpmInstall, NpmPackage
from coding_agent_env.agents.stream_json import parse_stream_json

__all__ = ["CLAUDE_CODE"]

VERSION = "2.1.331"
PACKAGE = "@anthropic-ai/claude-code"
BINARY = "@anthropic-ai/claude-code-linux-x64/claude"
"""The native binary the package's optional dependency ships for Linux x64."""


def render(ctx: LaunchContext) -> Launch:
    env = {
        "ANTHROPIC_BASE_URL": ctx.base_url.removesuffix("/v1"),
        "ANTHROPIC_AUTH_TOKEN": ctx.token,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "IS_SANDBOX": "1",
    }
    argv = (
        f"{ctx.prefix}/node_modules/{BINARY}", "-p", "--output-format", "stream-json", "--verbose",
        "--dangerously-skip-permissions", "--model", ctx.model,
    )
    return Launch(argv=argv, env=env)


CLAUDE_CODE = CliAgentSpec(
    name="claude-code",
    installs=(NpmInstall((NpmPackage(PACKAGE, VERSION),)),),
    render=render,
    parse_events=parse_stream_json,
)
