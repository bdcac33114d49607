"""Run the verify commands after the agent, in a context the agent cannot have prepared.

Contract: called only once the agent's whole process tree is dead. The verifier directory is deleted and
made anew (so a planted reward file, or a symlink in its place, is gone), then each command runs through
the sandbox's shell with a fresh private HOME and /tmp, the standard PATH and `REWARD_FILE` set, under its
own timeout. Afterwards the reward file, if verify wrote one, is read (bounded).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from coding_agent_env.errors import SandboxFileError, SandboxFileNotFoundError
from coding_agent_env.models import CommandResult
from coding_agent_env.sandbox.base import ExecResult, Sandbox

__all__ = ["VerifyOutcome", "command_result", "run_command", "run_verify", "verifier_dir"]

_REWARD_READ_BYTES = 4096


@dataclass(frozen=True)
class VerifyOutcome:
    results: list[CommandResult]
    reward_text: str | None
    reward_problem: str | None = None
    """Why a reward file that exists could not be read (it is then ignored)."""


def verifier_dir(sandbox: Sandbox) -> str:
    return f"{sandbox.paths.logs}/verifier"


def _text(data: bytes, dropped: int) -> str:
    text = data.decode("utf-8", "replace")
    return f"{text}\n[... {dropped} more bytes dropped]" if dropped else text


def command_result(cmd: str, done: ExecResult) -> CommandResult:
    return CommandResult(
        cmd=cmd,
        exit_code=done.exit_code,
        stdout=_text(done.stdout, done.stdout_dropped),
        stderr=_text(done.stderr, done.stderr_dropped),
        duration_s=round(done.duration_s, 6),
        timed_out=done.timed_out,
    )


async def run_command(
    sandbox: Sandbox, cmd: str, *, timeout: float, max_output_bytes: int, fresh: bool, env: dict[str, str] | None = None
) -> CommandResult:
    """One task command through the sandbox's shell; the string is passed whole as `-c`'s argument."""
    done = await sandbox.exec(
        [sandbox.shell, "-c", cmd], timeout=timeout, env=env, fresh=fresh, max_output_bytes=max_output_bytes
    )
    return command_result(cmd, done)


async def run_verify(
    sandbox: Sandbox,
    commands: Sequence[str],
    *,
    timeout: float,
    max_output_bytes: int,
    on_result: Callable[[int, CommandResult], None],
) -> VerifyOutcome:
    directory = verifier_dir(sandbox)
    reward_file = f"{directory}/reward.txt"
    await sandbox.remove(directory)
    await sandbox.mkdir(directory)
    results: list[CommandResult] = []
    for index, cmd in enumerate(commands):
        result = await run_command(
            sandbox, cmd, timeout=timeout, max_output_bytes=max_output_bytes, fresh=True, env={"REWARD_FILE": reward_file}
        )
        results.append(result)
        on_result(index, result)
    try:
        raw = await sandbox.read_bytes(reward_file, max_bytes=_REWARD_READ_BYTES)
    except SandboxFileNotFoundError:
        return VerifyOutcome(results, None)
    except SandboxFileError as exc:
        return VerifyOutcome(results, None, f"reward file ignored: {exc}")
    return VerifyOutcome(results, raw.decode("utf-8", "replace"))
