"""A live shell: one `bash` that lives as long as the episode, fed one command (or keystrokes) at a time.

Where the sandbox can hold a process with pipes (`Sandbox.attach`), an episode's commands run in one shell
that carries over everything a shell keeps: the working directory, variables exported or not, functions,
aliases, `set -o` options, and background jobs, which live until the episode ends (a dev server started in one
step answers in the next). A command is a pipe round trip, not a process spawn.

Inside the sandbox, two processes (bash only: any image with bash works):
- the **supervisor** (`SUPERVISOR`, the attached process) reads requests from its stdin and answers on its
  stdout; it starts the shell in a process group of its own and holds both ends of two FIFOs in the shell's
  directory: `live-input` (the shell's stdin: what it runs, and what keystrokes reach) and `live-control` (the
  shell's fd 199: one line per finished command);
- the **shell** (`BOOT` is its first input) runs each command as `{ eval "$cmd"; } <live-stdin` in itself (so
  state carries over; `live-stdin` is empty, as /dev/null is, but tells the foreground job's processes from
  background jobs, which read /dev/null), then saves its exported variables and working directory to
  `live-state.sh` and writes `r RC TOKEN` on fd 199, TOKEN random per command and written on the command's line
  after it (no variable of the shell holds it: a command writing to fd 199 by mistake ends nothing). Its stdout
  and stderr, and every background job's, append to `live-output`.

Request (server -> supervisor): `OP NONCE ARG NBYTES\\n` then NBYTES of payload; `RUN` (ARG: the timeout, ms;
payload: the command) or `KEYS` (ARG: how long to wait, ms; payload: the keys, or `\\x03` for an interrupt).
Answer: the output since the last answer (`live-output`, its first and last `keep` bytes with a note of what
was left out between, then emptied), then `\\x1eNONCE STATUS RC\\x1f`. STATUS:
- `done`: the command ended by itself (RC its exit status);
- `interrupted`: its timeout passed and SIGINT to the shell's group ended the foreground job (background jobs
  of a shell without job control ignore SIGINT, and the shell traps it: both live on);
- `killed`: the foreground job survived SIGINT and was SIGKILLed (the processes of the group that do not ignore
  SIGINT, but the shell; then those reading the command's stdin);
- `restarted`: nothing of that ended it (a loop in the shell itself): the shell's group was killed, background
  jobs with it, and a new shell started from the saved state;
- `exited`: the command ended the shell (`exit`, `exec`, a signal): a new shell started from the saved state.

The nonce is the server's, random per request, and reaches only the supervisor: output cannot end a request
early by accident, nor by design without reading the supervisor's memory. Whatever the supervisor says is
still the sandbox's (untrusted): answers are read bounded, under a deadline, and a supervisor that dies or
stops answering is replaced (`restarted`, with the saved state).

Without a terminal device: programs see pipes (`python3 -i` for a REPL; `read` prompts work; a pager or an
editor does not).
"""

from __future__ import annotations

import abc
import asyncio
import secrets
from dataclasses import dataclass

from coding_agent_env.errors import SandboxError, SandboxUnsupportedError
from coding_agent_env.sandbox.base import Attached, Process, Sandbox

__all__ = ["BOOT", "SUPERVISOR", "LiveOutcome", "LiveShell", "LiveShellError"]

START_TIMEOUT_S = 15.0
ANSWER_GRACE_S = 8.0
"""Beyond a request's own time: the supervisor's interrupt, two kills and restart (about 3 s), and slack."""
NOTE_BYTES = 256
MAX_KEYS_DURATION_S = 60.0


class LiveShellError(SandboxError):
    """The live shell could not be started (the caller falls back to one exec per command)."""


BOOT = r"""trap ': ' INT
trap 'printf "x %s\n" "$?" >&199' EXIT
shopt -s expand_aliases
if [ -s "$1" ]; then . "$1" >/dev/null 2>&1; fi
readonly __cae_state="$1"
__cae_done() {
  { export -p; printf 'cd -- %q\n' "$PWD"; } >"$__cae_state" 2>/dev/null
  printf 'r %s %s\n' "$1" "$2" >&199
}
readonly -f __cae_done
__cae_done 0 boot
"""
"""The shell's first input: its traps, the saved state (after a restart), and how a command reports its end."""

SUPERVISOR = r"""
export LC_ALL=C
exec 2>/dev/null
__dir=$1 __keep=$2 __boot=$(<"$1/live-boot.sh")
__out=$__dir/live-output __state=$__dir/live-state.sh __in=$__dir/live-input __ctl=$__dir/live-control
__long=$__dir/live-command __null=$__dir/live-stdin
rm -f -- "$__in" "$__ctl" "$__null"
mkfifo -m 600 -- "$__in" "$__ctl" && : >"$__null" || { printf '\036- failed 0\037'; exit 1; }
exec 7<>"$__in" 8<>"$__ctl"
: >"$__out"
__sh=

__ms() { if [ -n "$EPOCHREALTIME" ]; then __t=$(( ${EPOCHREALTIME/./} / 1000 )); else __t=$(( SECONDS * 1000 )); fi; }

__token() { if [ -n "$SRANDOM" ]; then __tok=$SRANDOM$SRANDOM$SRANDOM; else __tok=$RANDOM$RANDOM$RANDOM$RANDOM; fi; }

__start() {
  __part= __tok=boot
  set -m
  bash --noprofile --norc -s "$__state" <"$__in" >>"$__out" 2>&1 199>"$__ctl" 7>&- 8>&- &
  __sh=$!
  set +m
  printf '%s\n' "$__boot" >&7
  __ms; __wait $(( __t + 10000 ))
}

__restart() { kill -KILL -- "-$__sh"; wait "$__sh"; __start; }

# Wait for the shell's line until $1 (ms): 0 with it in __line, 1 at the deadline, 2 if the shell died. The line is
# `x RC` (the shell exited) or `r RC TOKEN` with this request's token (a random one the command never sees: any
# other line on the FIFO, a command's own, is skipped). A read that times out keeps what it had read of a line
# (bash reads a FIFO a byte at a time): kept in __part.
__wait() {
  local left
  while :; do
    __ms; left=$(( $1 - __t ))
    [ "$left" -le 0 ] && return 1
    [ "$left" -gt 250 ] && left=250
    printf -v left '%d.%03d' $(( left / 1000 )) $(( left % 1000 ))
    if IFS= read -r -t "$left" -u 8 __line; then
      __line=$__part$__line __part=
      case $__line in "x "*|"r "*" $__tok") return 0 ;; esac
      continue
    fi
    __part+=$__line
    if ! kill -0 "$__sh"; then
      while IFS= read -r -t 0.05 -u 8 __line; do
        __line=$__part$__line __part=
        case $__line in "x "*|"r "*" $__tok") return 0 ;; esac
      done
      __part=; return 2
    fi
  done
}

# SIGKILL the foreground job: processes of the shell's group but the shell. With `int`, those that do not ignore
# SIGINT (background jobs of a shell without job control ignore it); with `stdin`, those reading the command's
# stdin (`live-stdin`) made during this command (a pid above `__since`, the namespace's last pid when it began:
# pids are handed out in order): a foreground job that ignores SIGINT, and background jobs this very command
# started, never an earlier command's.
__kill_fg() {
  local how=$1 p stat pgid k v ign
  for p in /proc/[0-9]*; do
    [ "${p#/proc/}" = "$__sh" ] && continue
    IFS= read -r stat <"$p/stat" || continue
    stat=${stat##*) }
    set -- $stat
    pgid=$3
    [ "$pgid" = "$__sh" ] || continue
    if [ "$how" = stdin ]; then
      [ "$p/fd/0" -ef "$__null" ] && [ "${p#/proc/}" -gt "$__since" ] || continue
    else
      ign=0
      while IFS=$': \t' read -r k v; do [ "$k" = SigIgn ] && { ign=$v; break; }; done <"$p/status"
      (( 16#$ign & 2 )) && continue
    fi
    kill -KILL "${p#/proc/}"
  done
}

__show() {
  local data size
  IFS= read -r -d '' -N $(( 2 * __keep + 1 )) data <"$__out"
  if [ "${#data}" -le $(( 2 * __keep )) ]; then
    printf '%s' "$data"
  else
    size=$(stat -c %s -- "$__out")
    head -c "$__keep" -- "$__out"
    printf '\n[... %s bytes of output left out ...]\n' $(( size - 2 * __keep ))
    tail -c "$__keep" -- "$__out"
  fi
  : >"$__out"
}

# The line a finished command wrote: `r RC TOKEN` (done), `x RC` (the shell exited: restart it).
__ended() {
  case $__line in
    "r "*) __rc=${__line#r }; __rc=${__rc%% *} ;;
    "x "*) __rc=${__line#x }; __status=exited; wait "$__sh"; __start ;;
  esac
}

__run() {
  __status=done __rc= __part=
  __token
  IFS= read -r __since </proc/sys/kernel/ns_last_pid || __since=0
  if [ "${#__data}" -le 4096 ]; then
    printf '__cae_cmd=%q\n' "$__data" >&7
  else
    printf '%s' "$__data" >"$__long"
    printf '__cae_cmd=$(<%q)\n' "$__long" >&7
  fi
  printf '{ eval "$__cae_cmd"; } <%q; __cae_done "$?" %s\n' "$__null" "$__tok" >&7
  __ms; __wait $(( __t + $1 ))
  case $? in
    0) __ended; return ;;
    2) __status=exited; wait "$__sh"; __start; return ;;
  esac
  kill -INT -- "-$__sh"
  __ms; __wait $(( __t + 1000 ))
  case $? in
    0) __ended; [ "$__status" = done ] && __status=interrupted; return ;;
    2) __status=exited; wait "$__sh"; __start; return ;;
  esac
  local how
  for how in int stdin; do
    __kill_fg "$how"
    __ms; __wait $(( __t + 1000 ))
    case $? in
      0) __ended; [ "$__status" = done ] && __status=killed; return ;;
      2) __status=exited; wait "$__sh"; __start; return ;;
    esac
  done
  __status=restarted __rc=; __restart
}

__keys() {
  __status=done __rc= __part=
  __token  # no command of ours runs: only the shell's end (`x`) is waited for
  if [ "$__data" = $'\003' ]; then kill -INT -- "-$__sh"; else printf '%s' "$__data" >&7; fi
  __ms; __wait $(( __t + $1 ))
  case $? in
    0) case $__line in "x "*) __ended ;; esac ;;
    2) __status=exited; wait "$__sh"; __start ;;
  esac
  __rc=
}

__start
__show >/dev/null
printf '\036- ready 0\037'
while IFS=' ' read -r __op __nonce __arg __n; do
  __data=
  if [ "${__n:-0}" -gt 0 ]; then IFS= read -r -d '' -N "$__n" __data; fi
  case $__op in
    RUN) __run "$__arg" ;;
    KEYS) __keys "$__arg" ;;
    *) __status=bad __rc= ;;
  esac
  __show
  printf '\036%s %s %s\037' "$__nonce" "$__status" "$__rc"
done
kill -KILL -- "-$__sh"
"""
"""The attached process: see the module docstring. Arguments: the shell's directory (holding it and `BOOT` as
`live-supervisor.sh` and `live-boot.sh`), `keep`."""


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
    "restarted": "timed out: the shell itself did not stop, so it was restarted with its working directory and "
                 "exported variables; its background jobs ended",
    "exited": "the shell exited: a new one was started with its working directory and exported variables; "
              "background jobs ended",
    "lost": "the shell stopped answering: a new one was started with its working directory and exported "
            "variables; background jobs ended",
}


CLIENT = r"""
export LC_ALL=C
d=$1 nonce=$2
case $3 in
  env) printf '%s' "$CAE_LIVE_REQUEST" >"$d/live-requests" ;;
  file) cat -- "$d/live-request" >"$d/live-requests" ;;
esac
while IFS= read -r -d $'\037' chunk; do
  printf '%s\037' "$chunk"
  case $chunk in *$'\036'"$nonce "*) exit 0 ;; esac
done <"$d/live-answers"
exit 3
"""
"""One request where the supervisor cannot be attached to: write it to the supervisor's request FIFO (from the
environment, or from a file when too long for one), then print its answers up to this request's marker."""

FIFOS = r"""rm -f -- "$1/live-requests" "$1/live-answers" && mkfifo -m 600 -- "$1/live-requests" "$1/live-answers"
"""
"""Made before the supervisor starts, so a request's exec never looks for them before they exist."""

SPAWN = r"""d=$1
exec 0<>"$d/live-requests" 1<>"$d/live-answers"
exec bash --noprofile --norc "$d/live-supervisor.sh" "$d" "$2"
"""
"""The supervisor as a background process whose stdin and stdout are FIFOs (held open both ways by itself, so
neither ends when a request's exec does)."""

_ENV_REQUEST_MAX = 96 * 1024
"""Longest request passed in the exec's environment (the kernel caps one variable at 128 KiB)."""


class _Channel(abc.ABC):
    """How requests reach the supervisor and its answers come back."""

    @abc.abstractmethod
    async def open(self, argv: list[str]) -> None:
        """Start the supervisor (`argv` runs it with its stdin and stdout as the channel)."""

    @abc.abstractmethod
    async def ask(self, nonce: str, request: bytes, timeout_s: float) -> bytes:
        """Send `request` (empty: none, only read) and return what came back up to and with `\\x1eNONCE ...\\x1f`.
        `LiveShellError` if the supervisor is gone, `TimeoutError` past `timeout_s`."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Kill the supervisor, its shell and everything they started. Idempotent."""


class _Attached(_Channel):
    """The supervisor attached with pipes (`Sandbox.attach`): a request is a pipe round trip."""

    def __init__(self, sandbox: Sandbox, user: str | None, cap: int) -> None:
        self.sandbox, self.user, self.cap = sandbox, user, cap
        self._attached: Attached | None = None
        self._buffer = bytearray()

    async def open(self, argv: list[str]) -> None:
        self._attached = await self.sandbox.attach(argv, user=self.user)
        self._buffer.clear()

    async def ask(self, nonce: str, request: bytes, timeout_s: float) -> bytes:
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
        attached, self._attached = self._attached, None
        if attached is not None:
            await asyncio.shield(attached.close())


class _Fifos(_Channel):
    """The supervisor as a background process (`Sandbox.spawn`) on two FIFOs, each request one exec (`CLIENT`):
    for backends that cannot attach (Docker, the remote ones). Its launcher kills every descendant on `kill()`."""

    def __init__(self, sandbox: Sandbox, directory: str, user: str | None, cap: int) -> None:
        self.sandbox, self.directory, self.user, self.cap = sandbox, directory, user, cap
        self._process: Process | None = None

    async def open(self, argv: list[str]) -> None:
        made = await self.sandbox.exec(["bash", "--noprofile", "--norc", "-c", FIFOS, "cae-live-fifos", self.directory],
                                       timeout=START_TIMEOUT_S, max_output_bytes=4096, user=self.user)
        if made.exit_code != 0:
            raise LiveShellError(f"cannot make the live shell's FIFOs: {made.stderr.decode('utf-8', 'replace')[:200]}")
        self._process = await self.sandbox.spawn(["bash", "--noprofile", "--norc", "-c", SPAWN, "cae-live-spawn",
                                                  *argv[-2:]], user=self.user)

    async def ask(self, nonce: str, request: bytes, timeout_s: float) -> bytes:
        if self._process is None or self._process.returncode is not None:
            raise LiveShellError("the live shell's supervisor ended")
        env: dict[str, str] = {}
        how = "none"
        if request and len(request) <= _ENV_REQUEST_MAX:
            env, how = {"CAE_LIVE_REQUEST": request.decode("utf-8", "surrogateescape")}, "env"
        elif request:
            await self.sandbox.write_bytes(f"{self.directory}/live-request", request, mode=0o600)
            how = "file"
        done = await self.sandbox.exec(["bash", "--noprofile", "--norc", "-c", CLIENT, "cae-live", self.directory,
                                        nonce, how], timeout=timeout_s, env=env, max_output_bytes=2 * self.cap,
                                       user=self.user)
        if done.timed_out:
            raise TimeoutError
        if done.exit_code != 0:
            raise LiveShellError(f"the live shell's request failed (exit {done.exit_code})")
        return done.stdout

    async def close(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            await asyncio.shield(process.kill())


class LiveShell:
    """See the module docstring. One request at a time (the episode serialises its calls); `close()` kills every
    process of the shell (its background jobs too) and is idempotent. Attached with pipes where the backend can
    (a request is a pipe round trip), else on FIFOs with one exec per request (the same shell, at an exec's
    cost)."""

    def __init__(self, sandbox: Sandbox, directory: str, *, max_output_bytes: int, user: str | None = None) -> None:
        self.sandbox = sandbox
        self.directory = directory
        self.user = user
        self.keep = max(max_output_bytes // 2, 1)
        self._channel: _Channel | None = None
        self.attached = True
        """Whether the supervisor is attached with pipes (else on FIFOs, one exec per request)."""

    @property
    def cap(self) -> int:
        """The most one answer holds (both ends, the note, the marker): more is the sandbox's, and dropped."""
        return 2 * self.keep + NOTE_BYTES

    async def start(self) -> None:
        """Start the supervisor and its shell; `LiveShellError` when it did not come up in time."""
        # The scripts as files, not arguments: a `ps` in the sandbox shows one short line.
        await self.sandbox.write_text(f"{self.directory}/live-supervisor.sh", SUPERVISOR)
        await self.sandbox.write_text(f"{self.directory}/live-boot.sh", BOOT)
        argv = ["bash", "--noprofile", "--norc", f"{self.directory}/live-supervisor.sh", self.directory, str(self.keep)]
        channel: _Channel = _Attached(self.sandbox, self.user, self.cap) if self.attached else \
            _Fifos(self.sandbox, self.directory, self.user, self.cap)
        try:
            await channel.open(argv)
        except SandboxUnsupportedError:
            self.attached = False
            channel = _Fifos(self.sandbox, self.directory, self.user, self.cap)
            await channel.open(argv)
        self._channel = channel
        try:
            status, _, _ = _parse(await channel.ask("-", b"", START_TIMEOUT_S), "-", self.cap)
        except (LiveShellError, TimeoutError) as exc:
            await self.close()
            raise LiveShellError(f"the live shell did not start: {exc or 'no answer in time'}") from None
        if status != "ready":
            await self.close()
            raise LiveShellError(f"the live shell did not start ({status})")

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
