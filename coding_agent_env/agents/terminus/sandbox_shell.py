"""Terminus's persistent shell in the server: the runner (`terminus.shell.RUNNER`) as one sandbox exec per
command.

The shell state lives in the agent dir (`terminus-shell.sh`, written by the runner as the sandbox's user), so
what a command leaves (`cd`, `export`) is what the next one starts from. Each exec is the sandbox's usual one:
its environment, its user, its limits, its whole tree killed at `timeout_s`. A command too long for one
argument goes through a file next to the state.
"""

from __future__ import annotations

from coding_agent_env.agents.terminus.shell import CommandOutcome, fits_inline, outcome, runner_argv, source_file
from coding_agent_env.sandbox.base import Sandbox

__all__ = ["SandboxShell"]


class SandboxShell:
    """See the module docstring. `agent_dir` is a sandbox directory the sandbox's user can write."""

    def __init__(self, sandbox: Sandbox, agent_dir: str, *, max_output_bytes: int) -> None:
        self.sandbox = sandbox
        self.state_path = f"{agent_dir}/terminus-shell.sh"
        self.command_path = f"{agent_dir}/terminus-command.sh"
        self.max_output_bytes = max_output_bytes

    async def run(self, command: str, *, timeout_s: float) -> CommandOutcome:
        if not fits_inline(command):
            await self.sandbox.write_text(self.command_path, command + "\n")
            command = source_file(self.command_path)
        done = await self.sandbox.exec(
            runner_argv(self.state_path, command), timeout=timeout_s, max_output_bytes=self.max_output_bytes
        )
        # The runner sends its stderr to stdout; stderr holds only what bash says before that.
        return outcome(done.exit_code, done.stderr + done.stdout, done.stdout_dropped, done.timed_out)
