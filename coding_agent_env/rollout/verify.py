"""Run the verify commands after the agent, in a context the agent cannot have prepared.

Contract: called only once the agent's whole process tree is dead. The verifier directory is deleted and
made anew (so a planted reward file, or a symlink in its place, is gone), then each command runs through
the task-command runner in a fresh context (a new private HOME and /tmp, the standard PATH) with
`REWARD_FILE` set, under its own timeout. Afterwards the reward file, if verify wrote one, is read (bounded;
`reward.txt`, else Harbor's `reward.json` in the same directory);
turning it into a reward is `reward.score`'s job.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from coding_agent_env.errors import SandboxFileError, SandboxFileNotFoundError, SandboxUnavailableError
from coding_agent_env.models import CommandResult
from coding_agent_env.reward.score import reward_from_json
from coding_agent_env.rollout.commands import CommandRunner
from coding_agent_env.sandbox.base import Sandbox

__all__ = ["VerifyOutcome", "run_verify", "tests_dir", "verifier_dir"]

_REWARD_READ_BYTES = 4096


@dataclass(frozen=True)
class VerifyOutcome:
    results: list[CommandResult]
    reward_text: str | None
    reward_problem: str | None = None
    """Why a reward file that exists could not be read (it is then ignored)."""


def verifier_dir(sandbox: Sandbox) -> str:
    return f"{sandbox.paths.logs}/verifier"


def tests_dir(sandbox: Sandbox) -> str:
    """The directory the sandbox shows at `/tests`; SandboxError when it shows none."""
    if sandbox.paths.tests is None:
        raise SandboxUnavailableError(
            f"this sandbox ({sandbox.isolation} isolation) cannot show hidden tests at /tests; "
            "use the local backend with bubblewrap, or Docker"
        )
    return f"{sandbox.paths.logs}/tests"


async def run_verify(
    runner: CommandRunner,
    commands: Sequence[str],
    *,
    on_result: Callable[[int, CommandResult], None],
    env: Mapping[str, str] | None = None,
) -> VerifyOutcome:
    """Run `commands` in order (each one's result to `on_result` as it ends), then read the reward file.
    `env` is added to each command's environment (`REWARD_FILE` is verify's own and always wins)."""
    sandbox = runner.sandbox
    directory = verifier_dir(sandbox)
    reward_file = f"{directory}/reward.txt"
    await sandbox.remove(directory)
    await sandbox.mkdir(directory)
    results: list[CommandResult] = []
    for index, cmd in enumerate(commands):
        result = await runner.run(cmd, fresh=True, env={**(env or {}), "REWARD_FILE": reward_file})
        results.append(result)
        on_result(index, result)
    for name in ("reward.txt", "reward.json"):
        try:
            raw = await sandbox.read_bytes(f"{directory}/{name}", max_bytes=_REWARD_READ_BYTES)
        except SandboxFileNotFoundError:
            continue
        except SandboxFileError as exc:
            return VerifyOutcome(results, None, f"reward file ignored: {exc}")
        text = raw.decode("utf-8", "replace")
        if name == "reward.json":
            try:
                text = reward_from_json(text)
            except ValueError as exc:
                return VerifyOutcome(results, None, f"reward.json ignored: {exc}")
        return VerifyOutcome(results, text)
    return VerifyOutcome(results, None)
