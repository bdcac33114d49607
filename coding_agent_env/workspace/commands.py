"""Task commands, setup's and verify's: one runner, so their deadline, output cap and redaction have one home.

A task command is a shell string the task's author wrote. It runs whole, as the sandbox shell's `-c` argument
(nothing of ours is interpolated into it), under its own timeout (at the deadline the sandbox kills its whole
process tree and the result says `timed_out`), with stdout and stderr each capped at `max_output_bytes` (what
is dropped is counted in a note). Known secrets are redacted from the result before anyone sees it: the
progress events carry it as well as the `RolloutResult`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from coding_agent_env.models import CommandResult
from coding_agent_env.workspace.redact import Redactor
from coding_agent_env.sandbox.base import ExecResult, Sandbox

__all__ = ["CommandRunner"]


@dataclass(frozen=True)
class CommandRunner:
    """Runs one workspace's task commands (setup, verify, a clean room's) in a sandbox."""

    sandbox: Sandbox
    timeout_s: float
    """Each command's own deadline."""
    max_output_bytes: int
    """Kept of each of stdout and stderr."""
    redact: Redactor
    user: str | None = None
    """Who the commands run as inside the sandbox (`Task.verify_user`); None: the sandbox's own user."""

    async def run(self, cmd: str, *, fresh: bool, env: Mapping[str, str] | None = None) -> CommandResult:
        """Run `cmd` to its end or its deadline. `fresh`: in a context the agent cannot have prepared (a new
        private HOME and /tmp, the sandbox's base environment), as verify needs. `SandboxError` only if it could
        not be run."""
        done = await self.sandbox.exec(
            [self.sandbox.shell, "-c", cmd],
            timeout=self.timeout_s,
            env=env,
            fresh=fresh,
            max_output_bytes=self.max_output_bytes,
            user=self.user,
        )
        return self._result(cmd, done)

    def _result(self, cmd: str, done: ExecResult) -> CommandResult:
        return CommandResult(
            cmd=self.redact.text(cmd),
            exit_code=_exit_code(done),
            stdout=self.redact.text(_text(done.stdout, done.stdout_dropped)),
            stderr=self.redact.text(_text(done.stderr, done.stderr_dropped)),
            duration_s=round(done.duration_s, 6),
            timed_out=done.timed_out,
        )


def _exit_code(done: ExecResult) -> int:
    """An int always (OpenEnv's clients require one): a command killed at its deadline reports 124, as timeout(1)
    does (`timed_out` says so unambiguously); -1 for one whose status was lost."""
    if done.exit_code is not None:
        return done.exit_code
    return 124 if done.timed_out else -1


def _text(data: bytes, dropped: int) -> str:
    text = data.decode("utf-8", "replace")
    return f"{text}\n[... {dropped} more bytes dropped]" if dropped else text
