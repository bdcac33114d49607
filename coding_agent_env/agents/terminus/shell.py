"""Terminus's persistent shell: the runner both drivers use, and `PersistentShell` for the standalone program.

Each command runs in a fresh `bash` (`RUNNER`) that first sources the state file (exported variables and the
working directory left by the previous command), then evaluates the command, and on exit (even through
`exit`) writes the state back. So `cd` and `export` survive between commands, a hung command is killed at its
timeout without losing the state of earlier ones, and nothing is interpolated into a shell string: the runner
is a constant, and the state path and the command text are its positional arguments. A command too long for
one argument (`MAX_INLINE_BYTES`) is written to a file, and the runner is given `. FILE` instead.

Output (stdout and stderr, merged in order) is kept up to `max_output_bytes` (its head), with a note saying
how many bytes were left out. In the server, `terminus.sandbox_shell` runs the same runner as a sandbox exec.
Standard library only.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from collections import namedtuple
from collections.abc import Mapping

__all__ = [
    "MAX_INLINE_BYTES", "RUNNER", "CommandOutcome", "PersistentShell", "fits_inline", "outcome", "runner_argv",
    "source_file",
]

RUNNER = r"""
__state="$1"; __cmd="$2"; shift 2
exec 2>&1
if [ -f "$__state" ]; then . "$__state" >/dev/null 2>&1; fi
trap '__rc=$?; { export -p; printf "cd -- %q\n" "$PWD"; } > "$__state.tmp" 2>/dev/null &&
      mv -f "$__state.tmp" "$__state"; exit $__rc' EXIT
eval "$__cmd"
"""
MAX_INLINE_BYTES = 128 * 1024 - 1
"""Longest command (UTF-8) passed inline: the kernel's cap on one argument, less its terminating NUL."""
_READ_CHUNK = 65536
_GRACE_S = 1.0
"""After the command exits, how long its output pipe may stay open (held by a background job)."""


# A named tuple, not a dataclass: importing `dataclasses` would cost the standalone program's start-up.
class CommandOutcome(namedtuple("CommandOutcome", ("exit_code", "output", "timed_out", "dropped_bytes"))):
    """`exit_code: int | None` (None when timed out), `output: str` (merged, capped), `timed_out: bool`,
    `dropped_bytes: int` (output bytes left out at the end)."""

    __slots__ = ()


def runner_argv(state_path: str, command: str) -> list[str]:
    """The runner's argv for one command text (inline: see `fits_inline`)."""
    return ["bash", "--noprofile", "--norc", "-c", RUNNER, "terminus-shell", state_path, command]


def fits_inline(command: str) -> bool:
    """Whether `command` can be one argument: short enough, and no NUL (which no argument can hold)."""
    return "\0" not in command and len(command.encode("utf-8", "surrogateescape")) <= MAX_INLINE_BYTES


def source_file(path: str) -> str:
    """The command text that runs the command written to `path` (a path of ours, quoted for the shell)."""
    return ". '" + path.replace("'", "'\\''") + "'"


def outcome(exit_code: int | None, head: bytes, dropped: int, timed_out: bool) -> CommandOutcome:
    text = head.decode("utf-8", "replace")
    if dropped > 0:
        text += f"\n[... {dropped} more bytes of output left out ...]\n"
    return CommandOutcome(None if timed_out else exit_code, text, timed_out, max(dropped, 0))


class PersistentShell:
    """The standalone program's shell: the runner as a host subprocess in its own session, killed by process
    group when it ends or times out. `state_dir` is private to the agent; `workdir` is where it starts."""

    def __init__(self, state_dir: str, workdir: str, env: Mapping[str, str], *, max_output_bytes: int) -> None:
        self.state_path = os.path.join(state_dir, "shell-state.sh")
        self.command_path = os.path.join(state_dir, "command.sh")
        self.workdir = workdir
        self.env = dict(env)
        self.max_output_bytes = max_output_bytes

    def run(self, command: str, *, timeout_s: float) -> CommandOutcome:
        if not fits_inline(command):
            with open(self.command_path, "w", encoding="utf-8", errors="surrogateescape") as handle:
                handle.write(command + "\n")
            command = source_file(self.command_path)
        proc = subprocess.Popen(
            runner_argv(self.state_path, command), cwd=self.workdir, env=self.env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            head, dropped, timed_out = self._read(proc, time.monotonic() + timeout_s)
        finally:
            _kill_group(proc.pid)
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        return outcome(proc.returncode, head, dropped, timed_out)

    def _read(self, proc: subprocess.Popen[bytes], deadline: float) -> tuple[bytes, int, bool]:
        """Read output until EOF (or the deadline): (the head kept, bytes dropped, whether the command
        outlived the deadline)."""
        assert proc.stdout is not None
        head = bytearray()
        dropped = 0
        fd = proc.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while True:
                if proc.poll() is not None:
                    deadline = min(deadline, time.monotonic() + _GRACE_S)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return bytes(head), dropped, proc.poll() is None
                if not selector.select(min(remaining, 0.25)):
                    continue
                chunk = os.read(fd, _READ_CHUNK)
                if not chunk:
                    return bytes(head), dropped, not _exits_by(proc, deadline)
                room = self.max_output_bytes - len(head)
                head += chunk[:room]
                dropped += max(len(chunk) - room, 0)


def _exits_by(proc: subprocess.Popen[bytes], deadline: float) -> bool:
    try:
        proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
    except subprocess.TimeoutExpired:
        return False
    return True


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
