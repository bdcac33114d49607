"""The live shell's channel against the agent's own processes (INTEGRITY 40, issue 42 item 2), on real
bubblewrap and on Docker (attached through the container's init): a background job started by one `terminal` step must not be able to read the commands of later
steps, answer for them, or end a step early; a shell stopped by its own child still ends the step by its
deadline, honestly. Every case checks the answers the episode gives, not the machinery.

The attacker is one Python program (`ATTACK`, a file of the task) started in the background by one step: it
tries every door it can find (FIFOs beside the shell's files, every descriptor of every other process of the
sandbox through /proc, the shell's and the supervisor's memory, ptrace), and where a door opens it stops the shell, reads what comes for it and
answers in its place, as the forgery measured on the old design did.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from tests.backends.conftest import Target, backend_for, docker_engine, no_leftover_containers  # noqa: F401
from tests.episode.test_episode import TASK, Starter, start  # noqa: F401 (a fixture)
from tests.helpers import poll

ATTACK = r'''
import ctypes, json, os, re, signal, stat, sys, time

shell, supervisor, logs, report = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
reached = []

def note(what):
    reached.append(what)

def try_open(path, flags):
    try:
        return os.open(path, flags | os.O_NONBLOCK)
    except OSError:
        return None

# 1. Files beside the shell's: any FIFO or socket there is a door.
doors = []
for top, _, names in os.walk(logs):
    for name in names:
        path = os.path.join(top, name)
        if stat.S_ISFIFO(os.lstat(path).st_mode):
            fd = try_open(path, os.O_RDWR)
            if fd is not None:
                note(f"fifo {name}")
                doors.append((name, fd))
# 2. Every pipe or socket of every other process of the sandbox (the shell, its supervisor, bubblewrap's PID 1,
# ...) through /proc; the shell's and the supervisor's memory and environment.
others = sorted(int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid())
for pid in others:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        fds = []
    for fd in fds:
        path = f"/proc/{pid}/fd/{fd}"
        try:
            target = os.readlink(path)
        except OSError:
            continue
        if not target.startswith(("pipe:", "socket:")) and not target.startswith(logs):
            continue
        opened = try_open(path, os.O_RDWR) or try_open(path, os.O_RDONLY) or try_open(path, os.O_WRONLY)
        if opened is not None:
            note(f"fd {pid}/{fd}")
            doors.append((os.path.basename(target), opened))
for pid in (shell, supervisor):
    for leaf in ("mem", "environ"):
        got = try_open(f"/proc/{pid}/{leaf}", os.O_RDONLY)
        if got is not None:
            note(f"{leaf} {pid}")
            os.close(got)
# 3. ptrace.
libc = ctypes.CDLL(None, use_errno=True)
PTRACE_SEIZE, PTRACE_DETACH = 0x4206, 17
for pid in (shell, supervisor):
    if libc.ptrace(PTRACE_SEIZE, pid, None, None) == 0:
        note(f"ptrace {pid}")
        libc.ptrace(PTRACE_DETACH, pid, None, None)

with open(report, "w") as handle:
    json.dump(reached, handle)
if not doors:
    sys.exit(0)

# A door opened: stop the shell, read what comes for it, answer in its place (the measured forgery).
os.kill(shell, signal.SIGSTOP)
control = dict(doors).get("live-control")
output = os.path.join(logs, "live-output")
deadline = time.monotonic() + 60
pending = b""
while time.monotonic() < deadline:
    got = b""
    for _, fd in doors:
        try:
            got += os.read(fd, 65536)
        except OSError:
            pass
    pending += got
    for token in re.findall(rb'__cae_done "\$\?" (\S+)', pending):
        with open(output, "ab") as out:
            out.write(b"FORGED\n")
        if control is not None:
            os.write(control, b"r 0 " + token + b"\n")
        pending = pending.replace(token, b"")
    for nonce in re.findall(rb"(?:RUN|KEYS) ([0-9a-f]{32}) ", pending):
        for name, fd in doors:
            try:
                os.write(fd, b"FORGED\n\x1e" + nonce + b" done 0\x1f")
            except OSError:
                pass
        pending = pending.replace(nonce, b"")
    time.sleep(0.01)
'''

LIVE = {**TASK, "command_timeout_s": 3, "files": {**TASK["files"], "attack.py": ATTACK}}


@pytest.fixture(params=["local", "docker"])
def target(request: pytest.FixtureRequest, backend_for: Callable[[str], Target]) -> Target:
    """Each case on both backends that have a live shell."""
    return backend_for(request.param)


async def _attacker(episode, report: str) -> list[str]:  # type: ignore[no-untyped-def]
    """Start the attacker in the background (one step) and return what it reached."""
    logs = episode.sandbox.paths.logs
    started = await episode.terminal(f"nohup setsid python3 attack.py $$ $PPID {logs} {report} >/dev/null 2>&1 &")
    assert started.exit_code == 0, started
    path = f"{episode.sandbox.paths.workdir}/{report}"
    text = await poll(lambda: _read(episode, path), "the attacker's report", timeout_s=20)
    return json.loads(text)


async def _read(episode, path: str) -> str | None:  # type: ignore[no-untyped-def]
    try:
        return await episode.sandbox.read_text(path)
    except Exception:
        return None


async def test_a_background_job_cannot_answer_for_later_commands(target: Target,
                                                                start: Starter) -> None:
    """The forgery measured on the old design: later `false` and `pytest; exit 7` must not come back as
    exit 0 with invented output. Each later step ends honestly (its own status, or a timeout)."""
    episode = await start(target, LIVE)
    assert episode.report().shell == "live"
    reached = await _attacker(episode, "reached.json")
    honest = []
    for command, code in (("false", 1), ("echo real; (exit 7)", 7)):
        out = await episode.terminal(command)
        assert "FORGED" not in out.output, (command, out)
        assert out.exit_code in (code, None) and (out.exit_code is not None or out.timed_out), (command, out)
        honest.append(out.exit_code == code)
    assert honest == [True, True]
    assert reached == [], f"the attacker reached the shell's channel: {reached}"
    assert (await episode.terminal("echo fine")).output == "fine\n"


async def test_a_background_job_cannot_reach_the_shell_or_its_supervisor(target: Target,
                                                                        start: Starter) -> None:
    """No descriptor, memory or ptrace of the shell or its supervisor is open to a process of the sandbox's
    uid; no FIFO lies beside the shell's files."""
    episode = await start(target, LIVE)
    reached = await _attacker(episode, "reached.json")
    assert reached == []
    listed = await episode.terminal(f"find {episode.sandbox.paths.logs} \\( -type p -o -type s \\) | wc -l")
    assert listed.output.strip() == "0"


async def test_a_command_cannot_end_its_step_early_or_fake_the_marker(target: Target,
                                                                     start: Starter) -> None:
    """Whatever a command (or its background job) writes, on its output, on any descriptor, or as signals to
    the supervisor from another process, the step ends when the command does, with its own status."""
    episode = await start(target, LIVE)
    fakes = ("printf '\\036- ready 0\\037\\036%s done 0\\037r 0 boot\\nx 0\\n' $RANDOM; "
             "for fd in 3 4 5 6 7 8 9 10 11 12 199; do { echo 'r 0 x' >&$fd; } 2>/dev/null; done; ")
    signals = ("for s in $(seq 34 64); do /bin/kill -s $s $PPID 2>/dev/null; builtin kill -n $s $PPID 2>/dev/null; "
               "done; ")
    out = await episode.terminal(fakes + signals + "sleep 1; echo after; (exit 5)")
    assert out.exit_code == 5 and not out.timed_out, out
    assert out.output.endswith("after\n") and "\x1e- ready 0\x1f" in out.output, out
    background = await episode.terminal(f"( sleep 0.3; {fakes}{signals} ) & sleep 1.5; echo mine; (exit 6)")
    assert background.exit_code == 6 and background.output.endswith("mine\n"), background
    assert (await episode.terminal("echo next")).output == "next\n"


async def test_a_shell_stopped_by_its_child_ends_the_step_by_its_deadline(target: Target,
                                                                         start: Starter) -> None:
    """A child that SIGSTOPs the shell: the step ends by its deadline as a timeout (never an exit status the
    shell did not give), and the next step runs in a working shell with the saved state."""
    episode = await start(target, LIVE)
    await episode.terminal("export KEEP=1")
    stopped = await episode.terminal("python3 -c 'import os, signal; os.kill(os.getppid(), signal.SIGSTOP)'; "
                                     "echo never")
    assert stopped.timed_out and stopped.exit_code is None and "never" not in stopped.output, stopped
    assert stopped.duration_s < LIVE["command_timeout_s"] + 12, stopped
    after = await episode.terminal("echo $KEEP")
    assert (after.output, after.exit_code) == ("1\n", 0), after


async def test_a_bash_job_holding_the_shells_input_can_steal_a_line_never_answer_for_it(
    target: Target, start: Starter
) -> None:
    """A subshell keeps the descriptors bash saved while its command ran (the shell's stdin among them): it can
    stop the shell and read what comes next, but what it read never runs as the step, and no end it sends is
    taken (the kernel names it, not the shell, as the sender): the step times out, honestly."""
    episode = await start(target, LIVE)
    await episode.terminal("export KEEP=1")
    thief = ("( sleep 0.5; kill -STOP $$; echo x >stopped; "
             "for fd in /proc/$BASHPID/fd/*; do n=${fd##*/}; [ $n -gt 2 ] && [ $n -lt 255 ] && "
             "{ while IFS= read -r -t 2 -u $n line; do printf '%s\\n' \"$line\" >>stolen.txt; done; } 2>/dev/null; "
             "done; for s in $(seq 34 50); do builtin kill -n $s $PPID; done; echo thief done >&2 ) & echo started")
    assert (await episode.terminal(thief)).output == "started\n"
    await poll(lambda: _read(episode, f"{episode.sandbox.paths.workdir}/stopped"), "the thief to stop the shell")
    stolen = await episode.terminal("sleep 1; false")
    assert stolen.timed_out and stolen.exit_code is None, stolen  # what it read never ran: no status but a timeout
    assert "false" in await episode.sandbox.read_text(f"{episode.sandbox.paths.workdir}/stolen.txt")
    after = await episode.terminal("echo $KEEP")
    assert (after.output, after.exit_code) == ("1\n", 0), after


async def test_a_rewritten_state_file_restores_variables_never_code(target: Target,
                                                                    start: Starter) -> None:
    """A background job rewrites the shell's saved state (functions, a trap, a command beside an export) and
    kills the shell: the new shell takes back exported variables and the working directory only, so `false`
    still fails and nothing of the file ran."""
    episode = await start(target, LIVE)
    state = f"{episode.sandbox.paths.logs}/agent/live-state.sh"
    poison = ("false() { return 0; }\ntrap 'echo FORGED' DEBUG\n"
              'declare -x POISON="$(echo ran > ran.txt)"\ndeclare -x KEPT="yes"; echo ran > ran2.txt\n'
              'declare -x PLAIN="a b"\n')
    await episode.sandbox.write_text(f"{episode.sandbox.paths.workdir}/poison.txt", poison)
    killer = f"( sleep 0.3; kill -9 $$; sleep 0.2; cp poison.txt {state}; echo x >killed ) & echo started"
    assert (await episode.terminal(killer)).output == "started\n"
    await poll(lambda: _read(episode, f"{episode.sandbox.paths.workdir}/killed"), "the shell to be killed")
    out = await episode.terminal("false")
    assert out.exit_code == 1 and "FORGED" not in out.output, out
    shown = await episode.terminal("echo \"$POISON|${KEPT-unset}|$PLAIN\"; ls ran*.txt 2>/dev/null | wc -l")
    assert shown.output == "$(echo ran > ran.txt)|unset|a b\n0\n", shown



async def test_typed_ahead_input_cannot_answer_for_the_next_command(target: Target, start: Starter) -> None:
    """Keystrokes that call the shell's own end function after a pause (so it runs while the next command waits
    in the pipe) end nothing: each command's end carries a random tag drawn once its line is written."""
    episode = await start(target, LIVE)
    await episode.keystrokes("sleep 0.5; __cae_cmd=; __cae_end 0 1; __cae_cmd=; __cae_end 0 0\n", 0.0)
    out = await episode.terminal("sleep 1; false")
    assert (out.exit_code, out.timed_out) == (1, False), out
