"""Agents that need no LLM: `oracle` runs the request's `solution`, `nop` does nothing.

The oracle alone sees the reference solution's files: the workspace lays `solution_files` at `/solution` for it
(`Workspace.provision(solution=True)`, the rollout asks only for the oracle), and its commands get
`solution_env`, in the workdir, as the task's `agent_user` (Harbor runs `solve.sh` so).

Task authors use them to prove a task: the oracle must pass verify, nop must not. Both take the same
pipeline path as the LLM agents (instruction file, agent log, deadline, tree kill).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from coding_agent_env.agents.base import Agent, AgentContext, run_in_sandbox
from coding_agent_env.models.task import SOLUTION_ROOT

__all__ = ["NopAgent", "OracleAgent", "run_solution"]


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
        return await run_solution(ctx, ctx.request.solution, ctx.request.solution_files)


async def run_solution(ctx: AgentContext, solution: list[str], files: Mapping[str, str]) -> int:
    """Lay `files` at `/solution` (afresh: a step's solution replaces the one before) and run `solution` there
    with the task's `solution_env`; its exit status."""
    sandbox, shell, env = ctx.sandbox, ctx.sandbox.shell, dict(ctx.request.solution_env)
    if files:
        entries, _ = await sandbox.list_files(SOLUTION_ROOT, max_entries=len(files) * 4 + 64)
        for entry in entries:  # the step before's solution, if any: the root itself is the sandbox's to keep
            if "/" not in entry.path:
                await sandbox.remove(f"{SOLUTION_ROOT}/{entry.path}")
        for path, text in files.items():
            await sandbox.write_text(f"{SOLUTION_ROOT}/{path}", text, mode=0o755 if path.endswith(".sh") else 0o644)
    if len(solution) == 1:
        # One command: its own `shell -c` directly, as the script would `exec` it (one shell start fewer).
        # It fits in one argument: `WireLimits.MAX_COMMAND_BYTES`.
        return await run_in_sandbox(ctx, [shell, "-c", solution[0]], env=env)
    script = f"{ctx.agent_dir}/solution.sh"
    await sandbox.write_text(script, solution_script(shell, solution), mode=0o700)
    return await run_in_sandbox(ctx, [shell, script], env=env)


class NopAgent(Agent):
    name = "nop"

    async def run(self, ctx: AgentContext) -> int:
        return 0
