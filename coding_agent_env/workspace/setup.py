"""The task's setup commands, one at a time, stopping at the first failure (INTEGRITY rule 11).

Shared by rollouts (in the agent's sandbox and again in a clean room) and interactive episodes: each command's
real result goes to `on_result` as it ends; the first that fails (non-zero exit or timed out) ends the run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from coding_agent_env.models import CommandResult
from coding_agent_env.workspace.commands import CommandRunner

__all__ = ["SetupFailure", "run_setup", "why_failed"]


@dataclass(frozen=True)
class SetupFailure:
    """The first setup command that failed: its index and its result."""

    index: int
    result: CommandResult

    @property
    def message(self) -> str:
        return f"setup command {self.index} {why_failed(self.result)}"


def why_failed(result: CommandResult) -> str:
    return "timed out" if result.timed_out else f"exited with {result.exit_code}"


async def run_setup(
    runner: CommandRunner,
    commands: Sequence[str],
    *,
    on_result: Callable[[int, CommandResult], None] | None = None,
) -> SetupFailure | None:
    """Run `commands` in order (not in a fresh context: setup prepares the workspace); the first failure, or
    None when all passed. `SandboxError` only if a command could not be run."""
    for index, cmd in enumerate(commands):
        result = await runner.run(cmd, fresh=False)
        if on_result is not None:
            on_result(index, result)
        if not result.ok:
            return SetupFailure(index, result)
    return None
