"""Running Terminus's commands with persistent shell state. Standard library only (runs in the sandbox).

Each command runs in a fresh `bash` in its own session (process group) that first sources the state file
(exported variables and the working directory left by the previous command), then sources the command's
own file, and on exit (even through `exit`) writes the state back. So `cd` and `export` survive between
commands, a hung command is killed by process group at its timeout without losing the state of earlier
ones, and nothing of ours is interpolated into a shell string: the runner script is a constant, the state
and command paths are positional arguments.

Output (stdout and stderr, merged) is kept up to `max_output_bytes`: its head and tail halves, with a
marker saying how much was dropped in between.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from collections import namedtuple
from collections.abc import Mapping

__all__ = ["CommandOutcome", "PersistentShell"]

_RUNNER = r"""
__state="$1"; __cmd="$2"; shift 2
if [ -f "$__state" ]; then . "$__state" >/dev/null 2>&1; fi
trap '__rc=$?; { export -p; printf "cd -- %q\n" "$PWD"; } > "$__state.tmp" 2>/dev/null && mv -f "$__state.tmp" "$__state"; exit $__rc' EXIT
. "$__cmd"
"""
_READ_CHUNK = 65536
_GRACE_S = 1.0
"""After the command exits, how long its output pipe may stay open (held by a background job)."""


# A named tuple, not a dataclass: importing `dataclasses` would cost every rollout's start-up (see `parse`).
class CommandOutcome(namedtuple("CommandOutcome", ("exit_code", "output", "timed_out", "dropped_bytes"))):
    """`exit_code: int | None` (None when timed out), `output: str` (merged, capped), `timed_out: bool`,
    `dropped_bytes: int` (output bytes left out of the middle)."""

    __slots__ = ()


class _Capped:
    """Head and tail of a byte stream within a budget."""

    def __init__(self, limit: int) -> None:
        self.half = max(limit // 2, 1)
        self.head = b""
        self.tail = b""
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail = (self.tail + chunk)[-self.half :]

    def text(self) -> tuple[str, int]:
        dropped = self.total - len(self.head) - len(self.tail)
        middle = f"\n[... {dropped} bytes of output omitted ...]\n".encode() if dropped > 0 else b""
        return (self.head + middle + self.tail).decode("utf-8", "replace"), max(dropped, 0)


class PersistentShell:
    """See the module docstring. `state_dir` is private to the agent; `workdir` is where it starts."""

    def __init__(self, state_dir: str, workdir: str, env: Mapping[str, str], *, max_output_bytes: int) -> None:
        self.state_path = os.path.join(state_dir, "shell-state.sh")
        self.command_path = os.path.join(state_dir, "command.sh")
        self.workdir = workdir
        self.env = dict(env)
        self.max_output_bytes = max_output_bytes

    def run(self, command: str, *, timeout_s: float) -> CommandOutcome:
        with open(self.command_path, "w", encoding="utf-8", errors="surrogateescape") as handle:
            handle.write(command + "\n")
        argv = ["bash", "--noprofile", "--norc", "-c", _RUNNER, "terminus-shell", self.state_path, self.command_path]
        proc = subprocess.Popen(
            argv, cwd=self.workdir, env=self.env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            captured, timed_out = self._read(proc, time.monotonic() + timeout_s)
        finally:
            _kill_group(proc.pid)
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        output, dropped = captured.text()
        return CommandOutcome(None if timed_out else proc.returncode, output, timed_out, dropped)

    def _read(self, proc: subprocess.Popen[bytes], deadline: float) -> tuple[_Capped, bool]:
        """Read output until EOF (or the deadline); also returns whether the command outlived the deadline."""
        assert proc.stdout is not None
        captured = _Capped(self.max_output_bytes)
        fd = proc.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while True:
                if proc.poll() is not None:
                    deadline = min(deadline, time.monotonic() + _GRACE_S)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return captured, proc.poll() is None
                if not selector.select(min(remaining, 0.25)):
                    continue
                chunk = os.read(fd, _READ_CHUNK)
                if not chunk:
                    return captured, not _exits_by(proc, deadline)
                captured.add(chunk)


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
