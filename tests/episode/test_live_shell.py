"""An episode's live shell (`sandbox.shell.live`, the local backend): a terminal's behaviour across `terminal`
calls, keystrokes for interactive programs, and what ends the shell, on real bubblewrap. Every test closes its
episodes and checks that nothing is left (`start`'s fixture: no process, mount, directory or cgroup)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from coding_agent_env.episode import EpisodeStatus, KeystrokesUnsupportedError
from tests.backends.conftest import Target
from tests.helpers import poll
from tests.episode.test_episode import TASK, Starter, start  # noqa: F401 (a fixture)

LIVE = {**TASK, "command_timeout_s": 2}


async def test_a_background_server_started_in_one_step_answers_in_the_next(
    backend_for: Callable[[str], Target], start: Starter
) -> None:
    episode = await start(backend_for("local"), LIVE)
    assert episode.report().shell == "live"
    started = await episode.terminal("python3 -m http.server 8123 --bind 127.0.0.1 >/dev/null 2>&1 & echo $!")
    assert started.exit_code == 0 and started.output.strip().isdigit()
    fetch = ("for i in $(seq 50); do python3 -c \"import urllib.request as u; "
             "print(u.urlopen('http://127.0.0.1:8123/').status)\" 2>/dev/null && break; sleep 0.1; done")
    answered = await episode.terminal(fetch)
    assert answered.output.strip() == "200", answered
    assert (await episode.terminal("jobs -p | wc -l")).output.strip() == "1"
    calls = episode.report().calls  # the environment's side of the time split, per tool
    assert calls["terminal"].count == 3 and calls["terminal"].failures == 0
    assert calls["terminal"].seconds >= answered.duration_s > 0


async def test_shell_state_of_every_kind_carries_over(backend_for: Callable[[str], Target], start: Starter) -> None:
    episode = await start(backend_for("local"), LIVE)
    await episode.terminal("cd work; greet() { echo \"hi $1\"; }; alias ll='echo listed'; set -o pipefail; "
                           "plain=kept; export EXPORTED=yes; ulimit -c 0")
    out = await episode.terminal("pwd; greet you; ll; set -o | grep -E '^pipefail' ; echo $plain $EXPORTED")
    assert out.output.split("\n")[:4] == [f"{episode.sandbox.paths.workdir}/work", "hi you", "listed",
                                          "pipefail       \ton"]
    assert out.output.split("\n")[4] == "kept yes" and out.exit_code == 0


async def test_a_timeout_ends_the_foreground_job_and_only_it(backend_for: Callable[[str], Target],
                                                             start: Starter) -> None:
    episode = await start(backend_for("local"), LIVE)
    await episode.terminal("export KEEP=1; cd work; sleep 300 &")
    stubborn = await episode.terminal("python3 -c 'import signal, time; signal.signal(signal.SIGINT, "
                                      "signal.SIG_IGN); time.sleep(300)'")
    assert stubborn.timed_out and stubborn.exit_code is None and "ignored SIGINT and was killed" in stubborn.note
    assert (await episode.terminal("jobs -p | wc -l")).output.strip() == "1"  # the background job lives on
    looping = await episode.terminal("while :; do :; done")  # in the shell itself: only a new shell ends it
    assert looping.timed_out and "restarted" in looping.note
    after = await episode.terminal("echo $KEEP; pwd; jobs -p | wc -l")
    assert after.output.split() == ["1", f"{episode.sandbox.paths.workdir}/work", "0"]


async def test_keystrokes_drive_a_repl_and_a_prompt(backend_for: Callable[[str], Target], start: Starter) -> None:
    episode = await start(backend_for("local"), LIVE)
    opened = await episode.keystrokes("python3 -i\n", 2.0)
    assert ">>>" in opened.output and opened.exit_code is None
    assert (await episode.keystrokes("print(6 * 7)\n", 0.5)).output.strip().startswith("42")
    await episode.keystrokes("exit()\n", 0.5)
    asked = await episode.keystrokes("printf 'continue? [y/N] '; read answer; echo \"got $answer\"\n", 0.5)
    assert asked.output == "continue? [y/N] "
    assert (await episode.keystrokes("y\n", 0.5)).output == "got y\n"
    interrupted = await episode.keystrokes("sleep 300\n", 0.2)
    assert interrupted.output == ""
    await episode.keystrokes("C-c", 0.2)
    assert (await episode.terminal("echo back")).output == "back\n"


async def test_a_shell_that_ends_is_replaced_with_its_state(backend_for: Callable[[str], Target],
                                                            start: Starter) -> None:
    episode = await start(backend_for("local"), LIVE)
    await episode.terminal("cd work; export KEEP=1")
    exited = await episode.terminal("exit 3")
    assert (exited.exit_code, exited.timed_out) == (3, False) and "the shell exited" in exited.note
    assert (await episode.terminal("echo $KEEP; pwd")).output.split() == ["1", f"{episode.sandbox.paths.workdir}/work"]
    replaced = await episode.terminal("exec true")
    assert "the shell exited" in replaced.note
    supervisor = await episode.terminal("kill -9 $PPID; sleep 5")  # the supervisor itself: untrusted ground
    assert supervisor.timed_out and "stopped answering" in supervisor.note
    assert (await episode.terminal("echo $KEEP")).output == "1\n"


async def test_a_forged_end_line_does_not_desynchronise_the_shell(backend_for: Callable[[str], Target],
                                                                  start: Starter) -> None:
    """A command that writes what the old shell's end-of-command line was, anywhere it can, ends nothing: its
    step ends with it, and the next command gets its own output and status."""
    episode = await start(backend_for("local"), LIVE)
    forged = await episode.terminal("echo 'r 0' >&199; echo 'r 0'; sleep 0.5; echo late")
    assert forged.output.endswith("r 0\nlate\n") and forged.exit_code == 0, forged
    out = await episode.terminal("echo mine; exit 4")
    assert out.output.endswith("mine\n") and out.exit_code == 4
    assert (await episode.terminal("echo fine")).output == "fine\n"


@pytest.mark.parametrize("ending", ["final_answer", "close", "expire"])
async def test_nothing_is_left_however_the_episode_ends(ending: str, backend_for: Callable[[str], Target],
                                                        start: Starter) -> None:
    """Background jobs of every kind end with the episode (the fixture checks no process is left); verify runs
    after they are dead: a job that would write the answer file cannot reach verify."""
    target = backend_for("local")
    if ending == "expire":  # the watchdog's path: idle past its timeout
        target = target._replace(settings=target.settings.model_copy(update={"episode_idle_timeout_s": 1.0}))
    episode = await start(target, {**LIVE, "verify_scripts": ['test "$(cat "$FINAL_ANSWER_FILE")" = 42']})
    logs = episode.sandbox.paths.logs
    await episode.terminal(f"sleep 300 & nohup setsid sleep 301 >/dev/null 2>&1 & "
                           f"(while :; do echo 42 > {logs}/final_answer.txt; sleep 0.01; done) &")
    if ending == "final_answer":
        report = await episode.final_answer("41")
        assert report.status is EpisodeStatus.COMPLETED and report.reward == 0.0
    elif ending == "close":
        await episode.close()
    else:
        await poll(lambda: episode.done, "the idle episode to expire", timeout_s=20)
        assert episode.report().status is EpisodeStatus.EXPIRED


async def test_docker_runs_the_live_shell_through_inits_control_socket(backend_for: Callable[[str], Target],
                                                                      start: Starter) -> None:
    """Docker attaches through the container's init (its control socket passes the supervisor's stdin and stdout
    as sockets): the same shell, with its state, background jobs, timeouts and keystrokes."""
    episode = await start(backend_for("docker"), LIVE)
    assert episode.report().shell == "live"
    await episode.terminal("cd work; greet() { echo hi; }; sleep 300 &")
    slow = await episode.terminal("sleep 60")
    assert slow.timed_out and "interrupted (SIGINT)" in slow.note
    assert (await episode.terminal("greet; jobs -p | wc -l")).output.split() == ["hi", "1"]
    assert (await episode.keystrokes("printf 'ok? '; read a; echo got $a\n", 0.5)).output == "ok? "
    assert (await episode.keystrokes("y\n", 0.5)).output == "got y\n"
    listed = await episode.terminal(f"find {episode.sandbox.paths.logs} \\( -type p -o -type s \\) | wc -l")
    assert listed.output.strip() == "0"  # no FIFO, no socket in the sandbox's files
    await episode.close()  # before the backend's own leftover check (the fixture's close comes after it)


async def test_backends_without_pipes_run_one_exec_per_command(backend_for: Callable[[str], Target],
                                                               start: Starter) -> None:
    """The remote backends (here the E2B stand-in) cannot attach to a process: a live shell there would need a
    channel in the sandbox's own files, open to its processes (INTEGRITY 40). One exec per command instead: `cd`
    and exported variables carry over, and keystrokes are refused saying why."""
    episode = await start(backend_for("e2b-fake"), LIVE)
    assert episode.report().shell == "per_command"
    await episode.terminal("cd work; export KEEP=1")
    assert (await episode.terminal("echo $KEEP; basename $PWD")).output.split() == ["1", "work"]
    with pytest.raises(KeystrokesUnsupportedError, match="use terminal"):
        await episode.keystrokes("ls\n", 0.1)
    await episode.close()


async def test_without_a_live_shell_keystrokes_are_refused(backend_for: Callable[[str], Target],
                                                           start: Starter) -> None:
    """Where no live shell can start (here no program on the task's PATH: not even `bash` for a supervisor), one
    exec per command, and keystrokes are refused saying why."""
    episode = await start(backend_for("local"), {**LIVE, "setup_scripts": [], "verify_scripts": ["true"],
                                                 "env": {"PATH": "/nonexistent"}})
    assert episode.report().shell == "per_command"
    with pytest.raises(KeystrokesUnsupportedError, match="use terminal"):
        await episode.keystrokes("ls\n", 0.1)
    assert "keystrokes" not in episode.report().calls  # refused before it was a call
