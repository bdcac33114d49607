"""Agents that need no LLM: `oracle` runs the request's `solution`, `nop` does nothing.

Task authors use them to prove a task: the oracle must pass verify, nop must not. Both take the same
pipeline path as the LLM agents (instruction file, agent log, deadline, tree kill).
"""

from __future__ import annotations

import shlex

from coding_agent_env.agents.base import Agent, AgentContext, run_in_sandbox

__all__ = ["NopAgent", "OracleAgent"]


def solution_script(shell: str, commands: list[str]) -> str:
    """A script running each command in its own `shell -c`, stopping at (and exiting with) the first
    failure. Each command is quoted whole, so nothing in it is re-interpreted by the script itself.
    The last command replaces the script's shell (`exec`): same exit code, one process fewer."""
    lines = [f"{shlex.quote(shell)} -c {shlex.quote(cmd)} || exit $?" for cmd in commands[:-1]]
    lines += [f"exec {shlex.quote(shell)} -c {shlex.quote(cmd)}" for cmd in commands[-1:]]
    return "\n".join(lines) + "\n"


class OracleAgent(Agent):
    name = "oracle"

    async def run(self, ctx: AgentContext) -> int:
        shell = ctx.sandbox.shell
        if len(ctx.request.solution) == 1:
            # One command: its own `shell -c` directly, as the script would `exec` it (one shell start fewer).
            # It fits in one argument: `WireLimits.MAX_COMMAND_BYTES`.
            return await run_in_sandbox(ctx, [shell, "-c", ctx.request.solution[0]])
        script = f"{ctx.agent_dir}/solution.sh"
        await ctx.sandbox.write_text(script, solution_script(shell, ctx.request.solution), mode=0o700)
        return await run_in_sandbox(ctx, [shell, script])


class NopAgent(Agent):
    name = "nop"

    async def run(self, ctx: AgentContext) -> int:
        return 0
