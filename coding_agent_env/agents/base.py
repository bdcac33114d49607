"""The agent contract.

An agent gets an `AgentContext` (the request, the open sandbox, where the instruction file is and where its
log goes) and returns its exit code. The pipeline owns the deadline: it cancels `run()` when the agent's time
is up, and `run()` must leave no process behind when it returns or is cancelled. `run_in_sandbox` gives every
agent that guarantee: spawn -> wait -> kill the whole tree in `finally`. An agent whose loop runs in the server
(Terminus: `llm_from_sandbox` false) starts nothing but sandbox execs, which die with their tree when cancelled.

`AgentError` means the agent could not be run at all (infrastructure); a non-zero exit code is the agent's
own outcome.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from coding_agent_env.llm.access import LlmAccess
from coding_agent_env.models import AgentEvents, RolloutRequest
from coding_agent_env.sandbox.base import Sandbox
from coding_agent_env.settings import Settings

__all__ = ["Agent", "AgentContext", "run_in_sandbox"]


@dataclass(frozen=True)
class AgentContext:
    request: RolloutRequest
    sandbox: Sandbox
    settings: Settings
    instruction_path: str
    """Sandbox path of a file holding the instruction verbatim."""
    agent_dir: str
    """Sandbox directory private to the agent's bookkeeping (scripts, configs)."""
    log_path: str
    """Sandbox path where the agent's stdout and stderr go; its tail lands in the result."""
    llm: LlmAccess | None = None
    """Set for agents with `needs_llm`."""


class Agent(abc.ABC):
    name: ClassVar[str]
    needs_llm: ClassVar[bool] = False
    llm_from_sandbox: ClassVar[bool] = True
    """Whether the agent's LLM calls come from inside the sandbox (a CLI agent: the sandbox then gets network
    `llm` and `LlmAccess` the relay as the sandbox sees it) or from the server itself (Terminus's loop: the
    sandbox gets no network, and `LlmAccess` the relay's loopback listener)."""

    def check_available(self, settings: Settings) -> None:
        """Raise `UnknownAgentError` if this agent cannot run on this server (e.g. not installed), so the
        request is refused before anything starts. Default: always available."""

    def events(self) -> AgentEvents | None:
        """After `run`: a summary of the agent's own event stream, if it has one."""
        return None

    def log_tail(self, max_bytes: int) -> str | None:
        """After `run`: the last `max_bytes` of the agent's log when the agent keeps it itself (it runs in the
        server); None when the log is the sandbox file at `AgentContext.log_path`."""
        return None

    @abc.abstractmethod
    async def run(self, ctx: AgentContext) -> int:
        """Run to completion and return the exit code. Cancellation must kill everything started."""


async def run_in_sandbox(
    ctx: AgentContext, argv: Sequence[str], *, env: Mapping[str, str] | None = None
) -> int:
    """Spawn argv in the workdir as the task's `agent_user`, with output to the agent log, wait, and always kill
    the whole tree."""
    process = await ctx.sandbox.spawn(
        argv, env=env, cwd=ctx.sandbox.paths.workdir, log_path=ctx.log_path, user=ctx.request.agent_user
    )
    try:
        return await process.wait()
    finally:
        await asyncio.shield(process.kill())
