"""A client written the way OpenEnv's `opencode_env` / `pi_env` clients are, run inside the openenv 0.10 virtualenv.

    python upstream_driver.py FLAVOUR URL ARGS_JSON     prints one JSON line: the parsed result and the raw keys

`FLAVOUR` is `opencode` (sends `template`) or `pi` (sends `image`). Like upstream's `run_rollout`, the client
sends every argument of upstream's tool on every call, empty strings and None included, through OpenEnv's own
`MCPToolClient`, and parses the reply's JSON text with a model of upstream's `RolloutResult` (pydantic's default
config, as upstream's: unknown fields are ignored, known ones must have upstream's types). The models and the
client are written here from upstream's field lists; this file imports only openenv, pydantic and the standard
library (the virtualenv does not have coding_agent_env).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from openenv.core.mcp_client import MCPToolClient
from pydantic import BaseModel, Field

TIMEOUT_S = 600


class UpstreamTurn(BaseModel):
    turn: int
    finish_reason: str | None = None
    completion_tokens: list[str] = Field(default_factory=list)
    completion_token_ids: list[int] = Field(default_factory=list)
    per_token_logps: list[float] = Field(default_factory=list)
    latency_s: float = 0.0
    timestamp: float = 0.0
    upstream_status: int | None = None
    upstream_error: dict[str, Any] | None = None


class UpstreamCommand(BaseModel):
    cmd: str
    exit_code: int
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0


class UpstreamResult(BaseModel):
    task_id: str = ""
    sandbox_id: str = ""
    reward: float | None = None
    agent_exit_code: int | None = None
    wall_s: float = 0.0
    mode: str = "transparent_proxy"
    setup_results: list[UpstreamCommand] = Field(default_factory=list)
    verify_results: list[UpstreamCommand] = Field(default_factory=list)
    proxy_turns: list[UpstreamTurn] = Field(default_factory=list)
    files: dict[str, str] = Field(default_factory=dict)
    files_extra: list[str] = Field(default_factory=list)
    agent_log_tail: str = ""
    proxy_log_tail: str = ""
    error: str | None = None


def reply_text(reply: Any) -> str:
    """The JSON text in whatever `MCPToolClient.call_tool` returned: a string, a dict of MCP content or of the
    result itself, or an object with `.content` / `.result.content`."""
    if isinstance(reply, str):
        return reply
    if isinstance(reply, dict):
        content = reply.get("content")
        if isinstance(content, list) and content and isinstance(content[0], dict) and "text" in content[0]:
            return str(content[0]["text"])
        return json.dumps(reply)
    holder = getattr(reply, "result", reply)
    content = getattr(holder, "content", None)
    if content:
        first = content[0]
        text = getattr(first, "text", None) if not isinstance(first, dict) else first.get("text")
        if isinstance(text, str):
            return text
    raise TypeError(f"no JSON text in the tool's reply: {type(reply).__name__}")


def run_rollout(env: Any, flavour: str, args: dict[str, Any]) -> str:
    """Every argument upstream's client sends, with its defaults; `args` overrides some."""
    sent: dict[str, Any] = {
        "endpoint": "", "base_url": "", "api_key": "", "model": "",
        "instruction": args["instruction"], "setup": [], "verify": [],
        "task_id": "", "mode": "transparent_proxy", "disable_thinking": None, "max_tokens_cap": 4096,
        "top_logprobs": 5, "agent_timeout_s": 600.0,
    }
    sent["template" if flavour == "opencode" else "image"] = ""
    sent.update(args)
    return reply_text(env.call_tool("run_rollout", **sent))


def main() -> None:
    flavour, url, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    with MCPToolClient(base_url=url, message_timeout_s=TIMEOUT_S).sync() as env:
        env.reset()
        text = run_rollout(env, flavour, args)
    parsed = UpstreamResult.model_validate_json(text)
    raw = json.loads(text)
    print(json.dumps({"parsed": parsed.model_dump(mode="json"), "raw": raw}))


if __name__ == "__main__":
    main()
