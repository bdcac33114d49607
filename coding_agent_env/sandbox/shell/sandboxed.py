"""The sandbox's persistent shell as one sandbox exec per command: the runner (`runner.RUNNER`) run by
`Sandbox.exec`. Interactive episodes and Terminus in the server use it.

The shell's files (`runner.Runner`: state, output, long command) live in a directory of the caller's,
written by the runner as the sandbox's user, so what a command leaves (`cd`, `export`) is what the next one starts from.
Each exec is the sandbox's usual one: its environment, its user, its limits, its whole tree killed at
`timeout_s`. What a command does to those files is the agent's own outcome, never a failure of ours: a long
command that cannot be written to its file is reported to the model as such.
"""

from __future__ import annotations

from coding_agent_env.errors import SandboxFileError
from coding_agent_env.sandbox.base import Sandbox
from coding_agent_env.sandbox.shell.runner import SHOW_TIMEOUT_S, CommandOutcome, Runner, fits_inline, outcome

__all__ = ["SandboxShell"]

EXIT_NOT_RUN = 126
"""The exit code reported for a command that could not even be started (as a shell reports it)."""


class SandboxShell:
    """See the module docstring. `agent_dir` is a sandbox directory the sandbox's user can write (the caller's:
    an agent's, or an episode's). `user`: who the commands run as (`Sandbox.exec`'s; a task's `agent_user`)."""

    def __init__(self, sandbox: Sandbox, agent_dir: str, *, max_output_bytes: int, user: str | None = None) -> None:
        self.sandbox = sandbox
        self.runner = Runner.under(agent_dir, max_output_bytes)
        self.user = user

    async def run(self, command: str, *, timeout_s: float) -> CommandOutcome:
        inline = fits_inline(command)
        if not inline:
            try:
                await self.sandbox.write_text(self.runner.command, command + "\n")
            except SandboxFileError as exc:
                return CommandOutcome(EXIT_NOT_RUN, f"[the command could not be written to a file: {exc}]", False)
        argv = self.runner.argv(command, from_file=not inline)
        done = await self.sandbox.exec(argv, timeout=timeout_s, max_output_bytes=self.runner.cap, user=self.user)
        # stderr holds only what the outer bash itself said.
        shown = done.stderr + done.stdout
        if done.timed_out:  # killed before it could show the output file: show it now
            late = await self.sandbox.exec(self.runner.show_argv(), timeout=SHOW_TIMEOUT_S,
                                           max_output_bytes=self.runner.cap, user=self.user)
            shown += late.stdout
        return outcome(done.exit_code, shown, done.timed_out)
