"""A live shell: one `bash` that lives as long as the episode, fed one command (or keystrokes) at a time.

Where the sandbox can hold a process with pipes (`Sandbox.attach`), an episode's commands run in one shell
that carries over everything a shell keeps: the working directory, variables exported or not, functions,
aliases, `set -o` options, and background jobs, which live until the episode ends (a dev server started in one
step answers in the next). A command is a pipe round trip, not a process spawn.

Inside the sandbox, two processes:
- the **supervisor** (`supervisor.py`, run by the sandbox's `python3 -I -S`, its source sent on its stdin, the
  attached process) reads requests from its stdin and answers on its stdout. It is non-dumpable, and it runs the
  shell from an execute-only copy of the sandbox's bash, so the shell is non-dumpable too: no process of the
  sandbox can open their descriptors or memory through /proc or ptrace them;
- the **shell** (`bash -s`), its stdin a pipe only the supervisor writes, its stdout and stderr (and every
  background job's) a pipe only the supervisor reads. Each command runs as `{ eval "$cmd"; } <live-stdin` in the
  shell itself (so state carries over; `live-stdin` is empty, as /dev/null is, but tells the foreground job's
  processes from background jobs, which read /dev/null). Its end is told by the shell's own `kill` builtin:
  real-time signals to the supervisor carrying the exit status and the request's random tag, which the
  supervisor takes only from the shell's pid (`si_pid`, as the kernel sets it) and only as `kill` sends them.
  No FIFO, file or descriptor any other process could use stands for the shell: whatever a command or a
  background job writes, reads or signals, a step ends only when the shell says so, or at its deadline.

The shell saves its exported variables and working directory after each command (`live-state.sh`); a restarted
shell takes them back parsed and re-quoted by the supervisor, never run as code.

Request (server -> supervisor): `OP NONCE ARG NBYTES\\n` then NBYTES of payload; `RUN` (ARG: the timeout, ms;
payload: the command) or `KEYS` (ARG: how long to wait, ms; payload: the keys, or `\\x03` for an interrupt).
Answer: the output since the last answer (its first and last `keep` bytes with a note of what was left out
between), then `\\x1eNONCE STATUS RC\\x1f`. STATUS:
- `done`: the command ended by itself (RC its exit status);
- `interrupted`: its timeout passed and SIGINT to the shell's group ended the foreground job (background jobs
  of a shell without job control ignore SIGINT, and the shell traps it: both live on);
- `killed`: the foreground job survived SIGINT and was SIGKILLed (the processes of the group that do not ignore
  SIGINT, but the shell; then those reading the command's stdin);
- `restarted`: nothing of that ended it (a loop in the shell itself, a stopped shell): the shell's group was
  killed, background jobs with it, and a new shell started from the saved state;
- `exited`: the command ended the shell (`exit`, `exec`, a signal): a new shell started from the saved state.

The nonce is the server's, random per request, and reaches only the (non-dumpable) supervisor. Whatever the
supervisor says is still the sandbox's: answers are read bounded, under a deadline, and a supervisor that dies
or stops answering is replaced (`lost`, with the saved state).

The local backend attaches with pipes (bubblewrap's PID 1 holds none of them); Docker through the container's
init, which passes the supervisor's stdin and stdout as sockets over its control socket. Backends that cannot
attach (the remote ones, and Docker on its `docker exec` transport) get no live shell: a channel through FIFOs in
the sandbox's files would be open to its processes (INTEGRITY 40), so the episode runs one exec per command.

Without a terminal device: programs see pipes (`python3 -i` for a REPL; `read` prompts work; a pager or an
editor does not). Where `python3` (with `ctypes` and memfds) is missing, no live shell either.
"""

from __future__ import annotations

import asyncio
import functools
import secrets
from dataclasses import dataclass
from pathlib import Path

from coding_agent_env.errors import SandboxError
from coding_agent_env.sandbox.base import Attached, Sandbox

__all__ = ["BOOTSTRAP", "LiveOutcome", "LiveShell", "LiveShellError", "supervisor_source"]

START_TIMEOUT_S = 15.0
ANSWER_GRACE_S = 8.0
"""Beyond a request's own time: the supervisor's interrupt, two kills and restart (about 3 s), and slack."""
NOTE_BYTES = 256
REASON_CHARS = 200
"""The most of the supervisor's own words (the sandbox's: untrusted) a start failure quotes."""
MAX_KEYS_DURATION_S = 60.0


class LiveShellError(SandboxError):
    """The live shell could not be started (the caller falls back to one exec per command)."""


@dataclass(frozen=True)
class LiveOutcome:
    """One request's outcome: as `runner.CommandOutcome` (`exit_code` None when it timed out), and `note`, what
    happened to the shell beyond the command's own output (None when nothing did)."""

    exit_code: int | None
    output: str
    timed_out: bool
    note: str | None = None


_NOTES = {
    "interrupted": "timed out: the foreground job was interrupted (SIGINT); the shell and its background jobs "
                   "live on",
    "killed": "timed out: the foreground job ignored SIGINT and was killed; the shell and its background jobs "
              "live on",
    "restarted": "timed out: the shell itself did not end the command (a loop in the shell, or the shell "
                 "stopped), so it was restarted with its working directory and exported variables; its background "
                 "jobs ended",
    "exited": "the shell exited: a new one was started with its working directory and exported variables; "
              "background jobs ended",
    "lost": "the shell stopped answering: a new one was started with its working directory and exported "
            "variables; background jobs ended",
}


@functools.cache
def supervisor_source() -> bytes:
    """The supervisor's source (`supervisor.py`: nothing of it runs in the server), read once."""
    return Path(__file__).with_name("supervisor.py").read_bytes()


BOOTSTRAP = (
    "import os,sys\n"
    "n=int(sys.argv[2]);b=b''\n"
    "while len(b)<n:\n"
    " c=os.read(0,n-len(b))\n"
    " if not c:sys.exit(1)\n"
    " b+=c\n"
    "sys.argv=sys.argv[1:2]+sys.argv[3:]\n"
    "exec(compile(b,'cae-live-supervisor','exec'))\n"
)
"""`python3 -c` program (arguments: a name, the source's length, then the supervisor's own): read the
supervisor's source from stdin, then run it as `__main__` with the name and its own arguments."""


class _Attached:
    """The supervisor attached with pipes (`Sandbox.attach`): a request is a pipe round trip."""

    def __init__(self, sandbox: Sandbox, user: str | None, cap: int) -> None:
        self.sandbox, self.user, self.cap = sandbox, user, cap
        self._attached: Attached | None = None
        self._buffer = bytearray()

    async def open(self, argv: list[str], source: bytes) -> None:
        self._attached = await self.sandbox.attach(argv, user=self.user)
        self._buffer.clear()
        await self._attached.write(source)

    async def ask(self, nonce: str, request: bytes, timeout_s: float) -> bytes:
        """Send `request` (empty: none, only read) and return what came back up to and with `\\x1eNONCE ...\\x1f`.
        `LiveShellError` if the supervisor is gone, `TimeoutError` past `timeout_s`."""
        attached = self._attached
        if attached is None or attached.process.returncode is not None:
            raise LiveShellError("the live shell's supervisor ended")
        if request:
            await attached.write(request)
        mark = b"\x1e" + nonce.encode() + b" "
        async with asyncio.timeout(timeout_s):
            while True:
                at = self._buffer.find(mark)
                end = self._buffer.find(b"\x1f", at) if at >= 0 else -1
                if end >= 0:
                    answer = bytes(self._buffer[:end + 1])
                    del self._buffer[:end + 1]
                    return answer
                chunk = await attached.reader.read(64 * 1024)
                if not chunk:
                    raise LiveShellError("the live shell's supervisor ended")
                self._buffer += chunk
                if len(self._buffer) > 2 * self.cap:  # keep the tail: the marker comes last
                    del self._buffer[:len(self._buffer) - 2 * self.cap]

    async def close(self) -> None:
        """Kill the supervisor, its shell and everything they started. Idempotent."""
        attached, self._attached = self._attached, None
        if attached is not None:
            await asyncio.shield(attached.close())


class LiveShell:
    """See the module docstring. One request at a time (the episode serialises its calls); `close()` kills every
    process of the shell (its background jobs too) and is idempotent. `start()` raises `SandboxUnsupportedError`
    where the backend cannot attach (the caller runs one exec per command)."""

    def __init__(self, sandbox: Sandbox, directory: str, *, max_output_bytes: int, user: str | None = None) -> None:
        self.sandbox = sandbox
        self.directory = directory
        self.user = user
        self.keep = max(max_output_bytes // 2, 1)
        self._channel: _Attached | None = None

    @property
    def cap(self) -> int:
        """The most one answer holds (both ends, the note, the marker): more is the sandbox's, and dropped."""
        return 2 * self.keep + NOTE_BYTES

    async def start(self) -> None:
        """Start the supervisor and its shell; `LiveShellError` when it did not come up in time."""
        # The source on stdin, not in a file: nothing of the sandbox's can stand in for it at a restart.
        source = supervisor_source()
        argv = ["python3", "-I", "-S", "-W", "ignore", "-c", BOOTSTRAP, "cae-live-supervisor", str(len(source)),
                self.directory, str(self.keep)]
        channel = _Attached(self.sandbox, self.user, self.cap)
        await channel.open(argv, source)
        self._channel = channel
        try:
            status, _, said = _parse(await channel.ask("-", b"", START_TIMEOUT_S), "-", self.cap)
        except (LiveShellError, TimeoutError) as exc:
            await self.close()
            raise LiveShellError(f"the live shell did not start: {exc or 'no answer in time'}") from None
        if status != "ready":
            await self.close()
            reason = "".join(c if c.isprintable() else "?" for c in said[:REASON_CHARS])
            raise LiveShellError(f"the live shell did not start ({status}{': ' + reason if reason else ''})")

    async def run(self, command: str, *, timeout_s: float) -> LiveOutcome:
        """Run one command (see the module docstring); its output and how it ended."""
        timeout_ms = max(int(timeout_s * 1000), 1)
        status, rc, output = await self._request("RUN", timeout_ms, command.encode("utf-8", "surrogateescape"),
                                                 timeout_s)
        timed_out = status in ("interrupted", "killed", "restarted", "lost")
        exit_code = None if timed_out or not rc.lstrip("-").isdigit() else int(rc)
        if status == "exited" and exit_code is None:
            exit_code = 1
        return LiveOutcome(exit_code, output, timed_out, _NOTES.get(status))

    async def keys(self, keys: str, *, duration_s: float) -> LiveOutcome:
        """Send keystrokes to the shell's input (what it runs, or what its foreground program reads; `C-c` or
        `\\x03` alone interrupts the foreground job), wait `duration_s`, and return the output since the last
        request."""
        duration_s = min(max(duration_s, 0.0), MAX_KEYS_DURATION_S)
        if keys.strip() == "C-c":
            keys = "\x03"
        status, _, output = await self._request("KEYS", int(duration_s * 1000), keys.encode("utf-8", "surrogateescape"),
                                                duration_s)
        return LiveOutcome(None, output, False, _NOTES.get(status))

    async def close(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close()

    async def _request(self, op: str, arg_ms: int, payload: bytes, budget_s: float) -> tuple[str, str, str]:
        if self._channel is None:
            await self._replace()
            return "lost", "", ""
        nonce = secrets.token_hex(16)
        request = f"{op} {nonce} {arg_ms} {len(payload)}\n".encode() + payload
        try:
            return _parse(await self._channel.ask(nonce, request, budget_s + ANSWER_GRACE_S), nonce, self.cap)
        except (LiveShellError, TimeoutError):
            await self._replace()
            return "lost", "", ""

    async def _replace(self) -> None:
        """A new supervisor and shell (from the saved state) for one that died or stopped answering."""
        await self.close()
        await self.start()


def _parse(answer: bytes, nonce: str, cap: int) -> tuple[str, str, str]:
    """(status, rc, output) of an answer ending in `\\x1eNONCE STATUS RC\\x1f`; the output is what came before the
    marker, its last `cap` bytes at most. `LiveShellError` without the marker."""
    mark = b"\x1e" + nonce.encode() + b" "
    at = answer.rfind(mark)
    end = answer.find(b"\x1f", at) if at >= 0 else -1
    if end < 0:
        raise LiveShellError("the live shell's answer has no end marker")
    status, rc = (answer[at + len(mark):end].decode("ascii", "replace").split(" ") + ["", ""])[:2]
    return status, rc, answer[:at][-cap:].decode("utf-8", "replace")
