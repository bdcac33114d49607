"""The built-in Terminus agent: its loop runs in the server, its commands in the sandbox.

Each rollout drives `terminus.core.conversation` on the server's event loop:
- every LLM call goes through the relay (its loopback listener, with the rollout's token), so the turns are
  recorded, capped and intercepted like any agent's;
- every command is one sandbox exec of the persistent-shell runner (`sandbox.shell.sandboxed`), under
  `terminus_command_timeout_s`, as the sandbox's own user.

So nothing of the agent runs or waits inside the sandbox: no interpreter starts per rollout, the agent adds
nothing to the image but `bash`, and the relay token never enters the sandbox (whose network stays `none`:
its commands cannot reach the LLM at all). A large reply is decoded and parsed on a worker thread. The
pipeline's agent deadline cancels `run()`; a command in flight is then killed with its whole tree by the
sandbox's exec, and an LLM call in flight is dropped.

`terminus.loop` runs the same conversation as a standalone program (`standalone_argv`), for use outside
the server and as the benchmark's reference.
"""

from __future__ import annotations

import json
from collections.abc import Generator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from coding_agent_env.agents.base import Agent, AgentContext
from coding_agent_env.agents.event_stream import AgentReport, json_lines, render_transcript, report_events
from coding_agent_env.agents.terminus.core import Chat, Run, conversation
from coding_agent_env.agents.terminus.loop import BOOT
from coding_agent_env.agents.terminus.relay_chat import RelayChat
from coding_agent_env.aio import off_loop
from coding_agent_env.errors import AgentError
from coding_agent_env.models import AgentEvents
from coding_agent_env.sandbox.shell.sandboxed import SandboxShell
from coding_agent_env.settings import Settings, SettingsSection

__all__ = ["TerminusAgent", "TerminusConfig", "parse_terminus_events", "standalone_argv", "standalone_config"]



@dataclass(frozen=True)
class TerminusConfig(SettingsSection):
    """The loop's limits, from `Settings.terminus_*` (defined there, once)."""

    PREFIX = "terminus_"

    max_turns: int
    command_timeout_s: float
    max_output_bytes: int
    llm_timeout_s: float
    loose_parsing: bool


def record(report: AgentReport, kind: object, fields: dict[str, Any]) -> None:
    """Add what one Terminus event (`kind` and its fields, as `terminus.core` emits them) says to `report`
    (counting the event is the caller's)."""
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
    for event in json_lines(text, report):  # counts each event
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
        # "replace": a model's text may hold lone surrogates (the result's redaction pass makes them `?`).
        text = render_transcript(self.report, self.name).encode("utf-8", "replace")
        return text[-max_bytes:].decode("utf-8", "ignore")

    async def run(self, ctx: AgentContext) -> int:
        if ctx.llm is None:
            raise AgentError("agent terminus needs the LLM relay, and this rollout has none")
        config = TerminusConfig.from_settings(ctx.settings)
        report = self.report = AgentReport()

        def emit(kind: str, **fields: object) -> None:
            report.events += 1
            record(report, kind, fields)

        shell = SandboxShell(ctx.sandbox, ctx.agent_dir, max_output_bytes=config.max_output_bytes,
                             user=ctx.request.agent_user)
        steps = conversation(ctx.request.instruction, model=ctx.llm.model, max_turns=config.max_turns,
                             loose=config.loose_parsing, emit=emit)
        answer: object = None
        large = False
        async with RelayChat(ctx.llm.base_url, ctx.llm.token, timeout_s=config.llm_timeout_s) as chat:
            while True:
                # Parsing a reply is linear but pure Python: a large one is parsed off the event loop.
                need = await off_loop(_advance, steps, answer) if large else _advance(steps, answer)
                if isinstance(need, int):
                    return need
                if isinstance(need, Chat):
                    answer, large = await chat.complete(need.body)
                else:
                    answer, large = await shell.run(need.command, timeout_s=config.command_timeout_s), False


def _advance(steps: Generator[Chat | Run, object, int], answer: object) -> Chat | Run | int:
    """The conversation's next need, or its exit code once it ended. (StopIteration cannot cross a thread's
    future, so it is caught here.)"""
    try:
        return steps.send(answer)
    except StopIteration as done:
        return int(done.value)


def standalone_argv(config_path: str, *, python: str = "python3") -> list[str]:
    """The command that runs Terminus as a standalone program (`terminus.loop`) from this installed package,
    with the config at `config_path` (see `standalone_config`), the instruction on stdin and the endpoint's
    key in `TERMINUS_API_KEY`."""
    agents = Path(__file__).parent.parent
    return [python, "-I", "-S", "-B", "-c", BOOT, str(agents), str(agents.parent / "sandbox"), config_path]


def standalone_config(settings: Settings, *, base_url: str, model: str, state_dir: str) -> str:
    """The standalone program's config file content (JSON): this server's Terminus limits, the endpoint, and
    a private directory for the shell state."""
    limits = TerminusConfig.from_settings(settings)
    return json.dumps({**asdict(limits), "base_url": base_url, "model": model, "state_dir": state_dir})

