"""The built-in Terminus agent: its loop runs in the server, its commands in the sandbox.

Each rollout drives `terminus.core.conversation` on the server's event loop:
- every LLM call goes through the relay (its loopback listener, with the rollout's token), so the turns are
  recorded, capped and intercepted like any agent's;
- every command is one sandbox exec of the persistent-shell runner (`terminus.sandbox_shell`), under
  `terminus_command_timeout_s`, as the sandbox's own user.

So nothing of the agent runs or waits inside the sandbox: no interpreter starts per rollout, the sandbox
image needs only `bash`, and the relay token never enters the sandbox (whose network stays `none`: its
commands cannot reach the LLM at all). The pipeline's agent deadline cancels `run()`; a command in flight is
then killed with its whole tree by the sandbox's exec, and an LLM call in flight is dropped.

`terminus.loop` runs the same conversation as a standalone program (`standalone_argv`), for use outside
the server and as the benchmark's reference.
"""

from __future__ import annotations

import io
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import aiohttp

from coding_agent_env.agents.base import Agent, AgentContext
from coding_agent_env.agents.events import AgentReport, json_lines, render_transcript, report_events
from coding_agent_env.agents.terminus.core import Chat, ChatFailed, conversation, message_of
from coding_agent_env.agents.terminus.loop import BOOT
from coding_agent_env.agents.terminus.sandbox_shell import SandboxShell
from coding_agent_env.errors import AgentError
from coding_agent_env.models import AgentEvents
from coding_agent_env.settings import Settings

__all__ = ["TerminusAgent", "TerminusConfig", "parse_terminus_events", "standalone_argv", "standalone_config"]

MAX_RESPONSE_BYTES = 16 * 1024 * 1024
"""Largest chat completion read from the relay."""
_READ_CHUNK = 256 * 1024


@dataclass(frozen=True)
class TerminusConfig:
    """The loop's limits, from `Settings.terminus_*` (defined there, once)."""

    max_turns: int
    command_timeout_s: float
    max_output_bytes: int
    llm_timeout_s: float
    loose_parsing: bool

    @classmethod
    def from_settings(cls, settings: Settings) -> TerminusConfig:
        return cls(
            max_turns=settings.terminus_max_turns,
            command_timeout_s=settings.terminus_command_timeout_s,
            max_output_bytes=settings.terminus_max_output_bytes,
            llm_timeout_s=settings.terminus_llm_timeout_s,
            loose_parsing=settings.terminus_loose_parsing,
        )


def record(report: AgentReport, kind: object, fields: dict[str, Any]) -> None:
    """Add one Terminus event (`kind` and its fields, as `terminus.core` emits them) to `report`."""
    report.events += 1
    if kind == "turn":
        report.steps += 1
    elif kind == "command":
        report.add_tool("terminal", fields.get("command"))
    elif kind in ("text", "final"):
        report.add_text(fields.get("text"))
    elif kind in ("error", "parse_failure"):
        report.add_error(fields.get("error") or fields.get("reason"))


def parse_terminus_events(text: str) -> AgentReport:
    """The report of the standalone program's output (JSON lines). Total: any text gives a report (see
    `events.json_lines` for the bounds)."""
    report = AgentReport()
    for event in json_lines(text, report):
        report.events -= 1  # json_lines counted it already
        record(report, event.get("type"), event)
    return report


class TerminusAgent(Agent):
    name = "terminus"
    needs_llm = True
    llm_from_sandbox = False

    def __init__(self) -> None:
        self.report: AgentReport | None = None

    def events(self) -> AgentEvents | None:
        return None if self.report is None else report_events(self.report)

    def log_tail(self, max_bytes: int) -> str | None:
        if self.report is None:
            return None
        return render_transcript(self.report, self.name).encode()[-max_bytes:].decode("utf-8", "ignore")

    async def run(self, ctx: AgentContext) -> int:
        if ctx.llm is None:
            raise AgentError("agent terminus needs the LLM relay, and this rollout has none")
        config = TerminusConfig.from_settings(ctx.settings)
        report = self.report = AgentReport()
        shell = SandboxShell(ctx.sandbox, ctx.agent_dir, max_output_bytes=config.max_output_bytes)
        steps = conversation(
            ctx.request.instruction, model=ctx.llm.model, max_turns=config.max_turns, loose=config.loose_parsing,
            emit=lambda kind, **fields: record(report, kind, fields),
        )
        url = ctx.llm.base_url.rstrip("/") + "/chat/completions"
        headers = {"Authorization": f"Bearer {ctx.llm.token}", "Content-Type": "application/json"}
        timeout = aiohttp.ClientTimeout(total=config.llm_timeout_s)
        answer: object = None
        # No cookie jar and no proxies from the environment: the relay is on this host's loopback.
        async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar(), trust_env=False) as http:
            try:
                while True:
                    need = steps.send(answer)
                    if isinstance(need, Chat):
                        answer = await _chat(http, url, headers, need.body, timeout)
                    else:
                        answer = await shell.run(need.command, timeout_s=config.command_timeout_s)
            except StopIteration as done:
                return int(done.value)


async def _chat(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str], body: dict, timeout: aiohttp.ClientTimeout
) -> dict | ChatFailed:
    """The assistant message of one chat completion through the relay, or why there is none."""
    try:
        # A file-like body: aiohttp sends it in chunks (a long conversation can be megabytes).
        payload = io.BytesIO(json.dumps(body).encode())
        async with http.post(url, data=payload, headers=headers, timeout=timeout) as response:
            chunks, size = [], 0
            async for chunk in response.content.iter_chunked(_READ_CHUNK):
                size += len(chunk)
                if size > MAX_RESPONSE_BYTES:
                    return ChatFailed(f"response over {MAX_RESPONSE_BYTES} bytes")
                chunks.append(chunk)
            data = b"".join(chunks)
            if response.status != 200:
                return ChatFailed(f"HTTP {response.status}: {data[:500].decode('utf-8', 'replace')}")
            return message_of(json.loads(data))
    except (aiohttp.ClientError, TimeoutError, ValueError, RecursionError) as exc:
        return ChatFailed(f"{type(exc).__name__}: {str(exc)[:500]}")


def standalone_argv(config_path: str, *, python: str = "python3") -> list[str]:
    """The command that runs Terminus as a standalone program (`terminus.loop`) from this installed package,
    with the config at `config_path` (see `standalone_config`), the instruction on stdin and the endpoint's
    key in `TERMINUS_API_KEY`."""
    return [python, "-I", "-S", "-B", "-c", BOOT, str(Path(__file__).parent.parent), config_path]


def standalone_config(settings: Settings, *, base_url: str, model: str, state_dir: str) -> str:
    """The standalone program's config file content (JSON): this server's Terminus limits, the endpoint, and
    a private directory for the shell state."""
    limits = TerminusConfig.from_settings(settings)
    return json.dumps({**asdict(limits), "base_url": base_url, "model": model, "state_dir": state_dir})

