"""A CLI agent's outputs are untrusted (issue 27): the driver reads its events file and its log after it exits, and
whatever the agent left there (a directory or a symlink to a host file in their place, events its parser cannot
take) gives a report that says so, never an exception out of the agent's stage. A real bubblewrap sandbox; the
"CLI" is a bash script declared like any agent. Last, the agent log of a whole rollout, left as a directory or a
symlink."""

from __future__ import annotations

import shlex
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from coding_agent_env.agents.base import AgentContext
from coding_agent_env.agents.driver import CliAgent
from coding_agent_env.agents.event_stream import AgentReport, json_lines
from coding_agent_env.agents.spec import CliAgentSpec, Launch, LaunchContext
from coding_agent_env.llm.access import LlmAccess
from coding_agent_env.models import RolloutRequest, RolloutStatus
from coding_agent_env.rollout import run_rollout
from coding_agent_env.sandbox import Backends, Sandbox
from coding_agent_env.sandbox.base import SandboxSpec
from coding_agent_env.settings import Settings

HOST_FILE = "/etc/passwd"


def _hostile(ctx: LaunchContext) -> Launch:
    """Prints one event, then puts a directory where its events go and a symlink to a host file as its log."""
    events, log = f"{ctx.agent_dir}/events.jsonl", f"{ctx.agent_dir}/agent.log"
    script = (f"echo '{{\"type\": \"turn_start\"}}'; rm -f {shlex.quote(events)} && mkdir {shlex.quote(events)}; "
              f"rm -f {shlex.quote(log)} && ln -s {HOST_FILE} {shlex.quote(log)}")
    return Launch(argv=("/bin/bash", "-c", script))


def _printing(ctx: LaunchContext) -> Launch:
    return Launch(argv=("/bin/bash", "-c", "echo '{\"type\": \"turn_start\"}'; echo said-something >&2"))


def _raising_parser(text: str) -> AgentReport:
    report = AgentReport()
    for _ in json_lines(text, report):
        raise RuntimeError("a parser bug an event triggered")
    return report


class Hostile(CliAgent):
    name = "hostile"
    spec = CliAgentSpec(name="hostile", version="1.0.0", installs=(), version_package=None, render=_hostile,
                        parse_events=_raising_parser)


class BuggyParser(CliAgent):
    name = "buggy-parser"
    spec = CliAgentSpec(name="buggy-parser", version="1.0.0", installs=(), version_package=None, render=_printing,
                        parse_events=_raising_parser)


@pytest.fixture
async def sandbox(settings: Settings, assert_no_leftovers: None) -> AsyncIterator[Sandbox]:
    async with Backends(settings) as backends:
        made = await backends.get("local").create(SandboxSpec(rollout_id="cli-agent-outputs", deadline_s=60))
        try:
            yield made
        finally:
            await made.close()


def _context(sandbox: Sandbox, settings: Settings) -> AgentContext:
    agent_dir = f"{sandbox.paths.logs}/agent"
    return AgentContext(
        request=RolloutRequest(instruction="x"), sandbox=sandbox, settings=settings,
        instruction_path=f"{agent_dir}/instruction.md", agent_dir=agent_dir, log_path=f"{agent_dir}/agent.log",
        llm=LlmAccess(base_url="http://127.0.0.1:9/v1", token="tok-unused-here", model="m"),
    )


async def test_non_regular_events_and_log_are_noted_and_replaced(sandbox: Sandbox, settings: Settings) -> None:
    ctx = _context(sandbox, settings)
    await sandbox.write_text(ctx.instruction_path, "x")
    agent = Hostile()
    assert await agent.run(ctx) == 0
    report = agent.last_report
    assert report is not None and report.events == 0
    assert any(error.startswith("events file ignored: ") for error in report.errors), report.errors
    log = (await sandbox.read_bytes(ctx.log_path)).decode()
    assert "[coding-agent-env] hostile:" in log and Path(HOST_FILE).read_text() not in log
    assert Path(HOST_FILE).read_text().startswith("root:")  # the host's file was not written through the link


async def test_a_parser_that_raises_gives_a_report_that_says_so(sandbox: Sandbox, settings: Settings) -> None:
    ctx = _context(sandbox, settings)
    await sandbox.write_text(ctx.instruction_path, "x")
    agent = BuggyParser()
    assert await agent.run(ctx) == 0
    events = agent.events()
    assert events is not None and events.malformed == 1
    assert events.errors == ["events not parsed: RuntimeError"]
    log = (await sandbox.read_bytes(ctx.log_path)).decode()
    assert log.startswith("said-something\n") and "1 errors, 1 malformed lines" in log


@pytest.mark.parametrize("replace", ["mkdir", "ln -s /etc/passwd"])
async def test_a_rollouts_agent_log_that_is_not_a_regular_file_is_noted(
    settings: Settings, assert_no_leftovers: None, replace: str
) -> None:
    """The log's tail in the result says the log was not read; the rollout is scored as usual."""
    request = RolloutRequest(instruction="x", agent="oracle", sandbox="local", verify=["true"],
                             solution=[f"echo noise; rm -f /logs/agent/agent.log && {replace} /logs/agent/agent.log"])
    result = await run_rollout(request, settings=settings)
    assert (result.status, result.reward) == (RolloutStatus.COMPLETED, 1.0), result.error
    assert result.agent_log_tail.startswith("[coding-agent-env] the agent's log was not read: "), result.agent_log_tail
    assert "root:" not in result.agent_log_tail
