"""The sandbox's persistent shell: the runner every driver uses (`sandboxed`, `host`).

Each command runs in two fresh `bash`es. The inner one (`SHELL`)
- sources the state file: the exported variables and the working directory left by the previous command;
- evaluates the command (`eval`, whether it came inline or, when too long for one argument or holding a NUL,
  from a file: see `fits_inline`);
- on exit (even through `exit`) writes the state back.

The outer one (`RUNNER`) sends the inner one's stdout and stderr, merged in order, to the output file, and
once it ended, however it ended, prints that file (`SHOW`): whole when it is at most twice `keep` bytes, else
its first and last `keep` bytes with a note of how many were left out between.

So `cd` and `export` survive between commands, a hung command is killed at its timeout without losing the
state of earlier ones, the output is bounded inside the sandbox (the command never holds the outer shell's
stdout, so the server receives no more than that), and nothing is interpolated into a shell string: the
scripts are constants, and the paths and the command are positional arguments. A timed-out command's output
is printed by `SHOW` run on its own afterwards. Where the output file cannot be written (a command may have
put something in its place), output goes straight out.

Processes a command leaves in the background end with it. `sandboxed` runs the runner as a sandbox exec,
`host` as a host subprocess. Standard library only (see the package's docstring).
"""

from __future__ import annotations

from collections import namedtuple

__all__ = [
    "MAX_INLINE_BYTES", "RUNNER", "SHELL", "SHOW", "SHOW_TIMEOUT_S", "CommandOutcome", "Runner", "fits_inline",
    "outcome",
]

SHOW = r"""
if [ ! -s "$__out" ]; then :
elif __size=$(stat -c %s -- "$__out" 2>/dev/null) && [ "$__size" -gt $((2 * __keep)) ]; then
     head -c "$__keep" -- "$__out"; printf '\n[... %s bytes of output left out ...]\n' $((__size - 2 * __keep))
     tail -c "$__keep" -- "$__out"
else cat -- "$__out" 2>/dev/null; fi
"""
"""Prints the output file `$__out` within `2 * $__keep` bytes (and the note). An empty one costs no process
(no `stat`, no `cat`: about two milliseconds of a command with no output)."""

SHELL = r"""
if [ -f "$1" ]; then . "$1" >/dev/null 2>&1; fi
readonly __state="$1"; __cmd="$2"
if [ -n "$3" ]; then __cmd=$(< "$3"); fi
trap '__rc=$?; export -n __state; { export -p; printf "cd -- %q\n" "$PWD"; } > "$__state.tmp" 2>/dev/null &&
      mv -f -- "$__state.tmp" "$__state"; exit $__rc' EXIT
eval "$__cmd"
"""
"""The command's own shell: state in, the command, state out (even through `exit`). Where the state goes is
set after the state is sourced, and read-only: no command can redirect it."""

RUNNER = r"""
__shell="$1"; __state="$2"; __out="$3"; __keep="$4"; shift 4
if { : > "$__out"; } 2>/dev/null; then
  bash --noprofile --norc -c "$__shell" terminus-shell "$__state" "$@" > "$__out" 2>&1
  __rc=$?
""" + SHOW + r"""
  exit $__rc
fi
exec bash --noprofile --norc -c "$__shell" terminus-shell "$__state" "$@" 2>&1
"""
"""Runs `SHELL` with its output to the output file, then shows it (`SHOW`), whatever way that shell ended:
`exit` in a function, `exec`, a signal, a trap of the command's own. Where the output file cannot be written,
the output goes straight out instead."""

MAX_INLINE_BYTES = 128 * 1024 - 1
"""Longest command (UTF-8) passed inline: the kernel's cap on one argument, less its terminating NUL."""
NOTE_BYTES = 128
"""Room for the note beside the kept bytes."""
SHOW_TIMEOUT_S = 10.0
"""Deadline for printing a timed-out command's output."""


# Named tuples, not dataclasses: importing `dataclasses` would cost Terminus's standalone program's start-up.
class CommandOutcome(namedtuple("CommandOutcome", ("exit_code", "output", "timed_out"))):
    """`exit_code: int | None` (None when timed out), `output: str` (merged, bounded), `timed_out: bool`."""

    __slots__ = ()


class Runner(namedtuple("Runner", ("state", "output", "command", "keep"))):
    """How one command runs: the shell's files in a directory private to the agent (paths as the commands see
    them), and `keep`, the bytes of output kept at each end."""

    __slots__ = ()

    @classmethod
    def under(cls, directory: str, max_output_bytes: int) -> Runner:
        files = (f"{directory}/terminus-{name}" for name in ("state.sh", "output", "command.sh"))
        return cls(*files, max(max_output_bytes // 2, 1))

    @property
    def cap(self) -> int:
        """The most a run prints (both ends and the note): a backstop for whoever reads it."""
        return 2 * self.keep + NOTE_BYTES

    def argv(self, command: str, *, from_file: bool = False) -> list[str]:
        """The runner's argv: `command` inline, or (`from_file`) already written to `self.command`."""
        inline, file = ("", self.command) if from_file else (command, "")
        return ["bash", "--noprofile", "--norc", "-c", RUNNER, "terminus-runner", SHELL, self.state, self.output,
                str(self.keep), inline, file]

    def show_argv(self) -> list[str]:
        """Prints what a command that timed out left in the output file (as the runner would have)."""
        return ["bash", "--noprofile", "--norc", "-c", '__out="$1"; __keep="$2"' + SHOW, "terminus-show",
                self.output, str(self.keep)]


def fits_inline(command: str) -> bool:
    """Whether `command` can be one argument: short enough, and no NUL (which no argument can hold)."""
    return "\0" not in command and len(command.encode("utf-8", "surrogateescape")) <= MAX_INLINE_BYTES


def outcome(exit_code: int | None, shown: bytes, timed_out: bool) -> CommandOutcome:
    return CommandOutcome(None if timed_out else exit_code, shown.decode("utf-8", "replace"), timed_out)
