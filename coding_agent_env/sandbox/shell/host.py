"""The sandbox's persistent shell on this host: the runner (`runner.RUNNER`) as a host subprocess in its own
session, killed by process group when it ends or times out. Terminus's standalone program runs its commands
with it. Standard library only (see the package's docstring).
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from collections.abc import Mapping

from .runner import SHOW_TIMEOUT_S, CommandOutcome, Runner, fits_inline, outcome

__all__ = ["PersistentShell"]

_READ_CHUNK = 65536
_GRACE_S = 1.0
"""After the command exits, how long its output pipe may stay open (held by a background job)."""


class PersistentShell:
    """See the module docstring. `state_dir` is private to the agent; `workdir` is where it starts."""

    def __init__(self, state_dir: str, workdir: str, env: Mapping[str, str], *, max_output_bytes: int) -> None:
        self.runner = Runner.under(state_dir, max_output_bytes)
        self.workdir = workdir
        self.env = dict(env)

    def run(self, command: str, *, timeout_s: float) -> CommandOutcome:
        inline = fits_inline(command)
        if not inline:
            with open(self.runner.command, "w", encoding="utf-8", errors="surrogateescape") as handle:
                handle.write(command + "\n")
        shown, timed_out, code = self._run(self.runner.argv(command, from_file=not inline), timeout_s)
        if timed_out:  # killed before it could show the output file: show it now
            shown += self._run(self.runner.show_argv(), SHOW_TIMEOUT_S)[0]
        return outcome(code, shown, timed_out)

    def _run(self, argv: list[str], timeout_s: float) -> tuple[bytes, bool, int | None]:
        """(output, at most `runner.cap` bytes; whether it outlived `timeout_s`; exit code)."""
        proc = subprocess.Popen(
            argv, cwd=self.workdir, env=self.env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            shown, timed_out = self._read(proc, time.monotonic() + timeout_s)
        finally:
            _kill_group(proc.pid)
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        return shown, timed_out, proc.returncode

    def _read(self, proc: subprocess.Popen[bytes], deadline: float) -> tuple[bytes, bool]:
        """Read output until EOF (or the deadline), keeping a bounded head: (it, whether the command outlived
        the deadline)."""
        assert proc.stdout is not None
        limit = self.runner.cap
        head = bytearray()
        fd = proc.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while True:
                if proc.poll() is not None:
                    deadline = min(deadline, time.monotonic() + _GRACE_S)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return bytes(head), proc.poll() is None
                if not selector.select(min(remaining, 0.25)):
                    continue
                chunk = os.read(fd, _READ_CHUNK)
                if not chunk:
                    return bytes(head), not _exits_by(proc, deadline)
                head += chunk[: max(limit - len(head), 0)]


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
