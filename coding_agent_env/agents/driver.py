"""One driver for every `CliAgentSpec`:

    check installed -> render launch -> write config files -> write launcher -> spawn (under the pipeline's
    agent deadline) -> wait -> kill the tree -> read events -> parse -> keep the agent log's tail and append a transcript

The launcher is a small shell script in the agent dir, built only from our own sandbox paths and the spec's
argv, each `shlex.quote`d. It prepares HOME links, then `exec`s the CLI with the instruction file on stdin
and its stdout (the JSON events) redirected to the events file, so the instruction is never in any argv and
the exit code is the CLI's own. The token reaches the CLI only through its environment or 0600 files.

The pipeline cancels `run()` at the agent deadline; `run_in_sandbox` kills the whole tree on the way out.
"""

from __future__ import annotations

import logging
import shlex

from coding_agent_env.agents.base import Agent, AgentContext, run_in_sandbox
from coding_agent_env.agents.event_stream import AgentReport, parse_total, render_transcript, report_events
from coding_agent_env.agents.install import AgentNotInstalledError, check_installed
from coding_agent_env.agents.spec import CliAgentSpec, Launch, LaunchContext
from coding_agent_env.errors import (
    AgentError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxFileNotRegularError,
    UnknownAgentError,
)
from coding_agent_env.models import AgentEvents
from coding_agent_env.settings import Settings

__all__ = ["CliAgent", "MAX_EVENTS_BYTES", "launcher_script"]

log = logging.getLogger(__name__)

MAX_EVENTS_BYTES = 8 * 1024 * 1024
"""Bytes of the events file parsed after the run (the head; the rest is not read)."""
SESSION_TITLE = "coding-agent-env rollout"


def launcher_script(launch: Launch, ctx: LaunchContext, instruction: str, events: str) -> str:
    """The launcher for one launch (see the module docstring). Every word is quoted."""
    q = shlex.quote
    lines = ["set -e"]
    for link in launch.links:
        source, dest = f"{ctx.prefix}/{link.source}", f"{ctx.home}/{link.dest}"
        lines.append(f"mkdir -p -- {q(dest.rsplit('/', 1)[0])}")
        if link.copy:
            lines.append(f"cp -- {q(source)} {q(dest)}")
        else:
            lines.append(f"ln -sfn -- {q(source)} {q(dest)}")
    command = " ".join(q(arg) for arg in launch.argv)
    lines.append(f"exec {command} < {q(instruction)} > {q(events)}")
    return "\n".join(lines) + "\n"


class CliAgent(Agent):
    """Runs `spec` (the registry builds one per declared spec), named as it is; `last_report` holds the parsed
    events of the last run."""

    spec: CliAgentSpec
    needs_llm = True

    def __init__(self, spec: CliAgentSpec | None = None) -> None:
        if spec is not None:
            self.spec = spec
        self.last_report: AgentReport | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    def events(self) -> AgentEvents | None:
        return None if self.last_report is None else report_events(self.last_report)

    def check_available(self, settings: Settings) -> None:
        try:
            check_installed(self.spec, settings.agents_dir)
        except AgentNotInstalledError as exc:
            raise UnknownAgentError(f"{exc}; run `coding-agent-env agents install`") from exc

    def launch_context(self, ctx: AgentContext) -> LaunchContext:
        if ctx.llm is None:
            raise AgentError(f"agent {self.spec.name} needs the LLM relay, and this rollout has none")
        sandbox = ctx.sandbox
        if self.spec.needs_install:
            if sandbox.agents_dir is None:
                raise AgentNotInstalledError(
                    f"agent {self.spec.name} {self.spec.version}: no agents directory at {ctx.settings.agents_dir} "
                    f"(run `coding-agent-env agents install`)"
                )
            check_installed(self.spec, ctx.settings.agents_dir)
        prefix = f"{sandbox.agents_dir}/{self.spec.prefix_name}" if sandbox.agents_dir else ctx.agent_dir
        return LaunchContext(
            base_url=ctx.llm.base_url,
            token=ctx.llm.token,
            model=ctx.llm.model,
            home=sandbox.paths.home,
            workdir=sandbox.paths.workdir,
            agent_dir=ctx.agent_dir,
            prefix=prefix,
            title=SESSION_TITLE,
        )

    async def run(self, ctx: AgentContext) -> int:
        lctx = self.launch_context(ctx)
        launch = self.spec.launch(lctx)
        for item in launch.files:
            await ctx.sandbox.write_bytes(item.path, item.data(), mode=item.mode)
        events = f"{ctx.agent_dir}/{self.spec.events_file}"
        script = f"{ctx.agent_dir}/launch.sh"
        await ctx.sandbox.write_text(script, launcher_script(launch, lctx, ctx.instruction_path, events), mode=0o700)
        env = {**self.spec.extra_env, **launch.env}
        exit_code = await run_in_sandbox(ctx, [ctx.sandbox.shell, script], env=env)
        await self._report(ctx, events)
        return exit_code

    async def _report(self, ctx: AgentContext, events: str) -> None:
        """Parse the events and append a transcript to the agent log. Both files are the agent's output: missing
        events are not an error, and neither a file of another kind (a FIFO, a directory, a symlink) nor any
        content raises out of here; the report's errors say what was ignored."""
        problem = None
        try:
            text = await ctx.sandbox.read_text(events, max_bytes=MAX_EVENTS_BYTES)
        except SandboxFileNotFoundError:
            text = ""
        except SandboxError as exc:
            text, problem = "", f"events file ignored: {_why_unread(exc)}"
        self.last_report = parse_total(self.spec.parse_events, text)
        if problem is not None:
            self.last_report.add_error(problem)
        transcript = render_transcript(self.last_report, self.spec.name).encode("utf-8", "replace")
        try:
            current = await ctx.sandbox.read_bytes(ctx.log_path, max_bytes=ctx.settings.agent_log_tail_bytes, tail=True)
        except SandboxFileNotRegularError:
            current = b"[coding-agent-env] the agent's log was not a regular file: replaced\n"
        except SandboxError:
            current = b""
        try:
            # Removed first: whatever the agent left at the path (a FIFO, a directory) is replaced, never opened.
            await ctx.sandbox.remove(ctx.log_path)
            await ctx.sandbox.write_bytes(ctx.log_path, current + transcript)
        except SandboxError as exc:  # a full disk, a path the agent made unwritable: the agent's outcome stands
            log.warning("agent %s: transcript not appended to the log: %s", self.spec.name, exc)


def _why_unread(exc: SandboxError) -> str:
    return "not a regular file" if isinstance(exc, SandboxFileNotRegularError) else str(exc) or type(exc).__name__
