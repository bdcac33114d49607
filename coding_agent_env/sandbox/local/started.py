"""Whether bubblewrap started a command, told apart from the command's own exit status.

bwrap exits 1 both when the command it ran exited 1 and when its own setup failed (a bind source it could not
reach, a mount it could not make, a `--chdir` that failed, an exec that failed), printing `bwrap: ...` on the
same stderr the command writes. With `--json-status-fd FD` it reports on a descriptor of ours, which nothing in
the sandbox holds (bwrap closes it in the sandbox before the command starts): a `{"child-pid": N}` document
first, then `{"exit-code": N}` when the command exits, written only if its setup finished and the command's
exec succeeded (bubblewrap.c, `report_child_exit_status`). A bwrap that exited by itself without that document
never started the command.

Not every such failure is the server's: a command can make its own `--chdir` fail (the agent made its workdir
unreadable), and a sandbox whose process limit is taken by what its agent left cannot fork bwrap's init. So a
failed start is confirmed (`LocalSandbox`): a shell's `exit 0` run in `/` with the same binds and user (never in
a network namespace made for one spawn alone: closed by then), and no limit of the sandbox hit; only when that
cannot start either is it the plumbing's fault (`SandboxStartError`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable

from coding_agent_env.sandbox.base import Process

__all__ = ["MAX_STATUS_BYTES", "StartChecked", "StartReport"]

MAX_STATUS_BYTES = 64 * 1024
"""What is read of bwrap's status documents (a few dozen bytes each)."""


class StartReport:
    """A pipe bwrap reports on: pass `write_fd` (`Launch.command(status_fd=...)`), then, once bwrap has exited,
    `started()`. `close()` (idempotent) closes both ends."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)

    def started(self) -> bool:
        """Whether bwrap reported the command's exit (so it started it). Call after bwrap exited: everything it
        wrote is in the pipe (reads never block; the write end may still be open in this process)."""
        data = bytearray()
        while len(data) < MAX_STATUS_BYTES:
            try:
                chunk = os.read(self.read_fd, MAX_STATUS_BYTES - len(data))
            except BlockingIOError:
                break
            if not chunk:
                break
            data += chunk
        return any(_is_exit_document(line) for line in bytes(data).splitlines())

    def close_write(self) -> None:
        """Close our copy of the write end (once the command has it)."""
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    def close(self) -> None:
        self.close_write()
        if self.read_fd >= 0:
            os.close(self.read_fd)
            self.read_fd = -1


class StartChecked(Process):
    """A spawned process whose bwrap reports on `report`. `wait()` returns its exit code; when bwrap exited by
    itself (code >= 0) without starting it, it first awaits `confirm()`, which raises `SandboxStartError` when
    the sandbox's plumbing is at fault. `kill()` is the process's own (never raises for the start)."""

    def __init__(self, inner: Process, report: StartReport, confirm: Callable[[], Awaitable[None]]) -> None:
        self._inner = inner
        self._report = report
        self._confirm = confirm
        self.pid: int = getattr(inner, "pid", 0)

    @property
    def returncode(self) -> int | None:
        return self._inner.returncode

    async def wait(self) -> int:
        code = await self._inner.wait()
        # Asked once; a report closed already was asked, or the process was killed (by us: not a start failure).
        started = self._report.started() if self._report.read_fd >= 0 else True
        self._report.close()
        if not started and code >= 0:
            await self._confirm()
        return code

    async def kill(self) -> None:
        try:
            await self._inner.kill()
        finally:
            self._report.close()


def _is_exit_document(line: bytes) -> bool:
    try:
        document = json.loads(line)
    except ValueError:
        return False
    return isinstance(document, dict) and isinstance(document.get("exit-code"), int)
