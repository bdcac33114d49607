"""Terminus's shell as its standalone program runs it, and the event parsers of every agent (total, bounded)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coding_agent_env.agents.event_stream import AgentReport
from coding_agent_env.agents.opencode import parse_opencode_events
from coding_agent_env.agents.pi import parse_pi_events
from coding_agent_env.agents.terminus.agent import parse_terminus_events
from coding_agent_env.sandbox.shell.host import PersistentShell
from tests.helpers import poll

PARSERS = (parse_opencode_events, parse_pi_events, parse_terminus_events)


def shell(tmp_path: Path, max_output_bytes: int = 4096) -> PersistentShell:
    (tmp_path / "state").mkdir(parents=True)
    (tmp_path / "work").mkdir()
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    return PersistentShell(str(tmp_path / "state"), str(tmp_path / "work"), env, max_output_bytes=max_output_bytes)


def test_cwd_and_exports_persist_even_through_exit(tmp_path: Path) -> None:
    sh = shell(tmp_path)
    assert sh.run("mkdir -p 'a b' && cd 'a b' && export GREETING='hi there'; exit 3", timeout_s=10).exit_code == 3
    outcome = sh.run('pwd; echo "$GREETING"', timeout_s=10)
    assert outcome.output.splitlines() == [str(tmp_path / "work" / "a b"), "hi there"] and outcome.exit_code == 0


@pytest.mark.parametrize(("command", "code", "output"), [
    ('die() { echo "fatal: $1"; exit 1; }; echo working; die oops', 1, "working\nfatal: oops\n"),
    ('echo x; trap "echo mine" EXIT; echo y', 0, "x\ny\nmine\n"),
    ("echo a; exec true", 0, "a\n"),
    ("echo b; kill $$", 143, "Terminated\nb\n"),  # bash says how its child ended
    ("exec 10>lock; echo x; exec 10>&-; echo y", 0, "x\ny\n"),
    ("printf 'no newline'", 0, "no newline"),
])
def test_output_is_shown_however_the_command_ends(tmp_path: Path, command: str, code: int, output: str) -> None:
    assert shell(tmp_path).run(command, timeout_s=10)[:2] == (code, output)


def test_a_command_cannot_redirect_the_shells_own_bookkeeping(tmp_path: Path) -> None:
    sh = shell(tmp_path, max_output_bytes=1000)
    sh.run(f"export __keep=100000 __state={tmp_path}/elsewhere __out=/dev/zero; cd /tmp", timeout_s=10)
    noisy = sh.run("pwd; head -c 5000 /dev/zero | tr '\\0' x; echo; echo END", timeout_s=10)
    assert noisy.output.startswith("/tmp\n") and noisy.output.endswith("x\nEND\n")
    assert "bytes of output left out" in noisy.output and not noisy.timed_out
    assert not (tmp_path / "elsewhere").exists()


async def test_timeout_kills_the_command_group_and_keeps_state(tmp_path: Path) -> None:
    sh = shell(tmp_path)
    sh.run("cd /tmp", timeout_s=10)
    started = time.monotonic()
    pidfile = tmp_path / "background.pid"
    outcome = sh.run(f"echo started; sleep 60 & echo $! > {pidfile}; sleep 60", timeout_s=1)
    assert outcome.timed_out and outcome.exit_code is None and outcome.output == "started\n"
    assert time.monotonic() - started < 10
    assert sh.run("pwd", timeout_s=10).output.strip() == "/tmp"
    await poll(lambda: not _running(int(pidfile.read_text())))  # the background job died with the command


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def test_output_keeps_its_head_and_tail_with_a_note_of_what_was_left_out(tmp_path: Path) -> None:
    noisy = "echo START; head -c 100000 /dev/zero | tr '\\0' x; echo; echo END >&2"
    outcome = shell(tmp_path, max_output_bytes=1000).run(noisy, timeout_s=10)
    assert outcome.output.startswith("START\n") and outcome.output.endswith("x\nEND\n")
    assert "[... 99011 bytes of output left out ...]" in outcome.output and len(outcome.output) < 1100
    small = shell(tmp_path / "2", max_output_bytes=1000).run("printf 'a\\0b'; echo; exit 7", timeout_s=10)
    assert (small.exit_code, small.output) == (7, "a\0b\n")


def test_parsers_read_their_agents_events() -> None:
    opencode = parse_opencode_events(
        '{"type":"step_start","part":{}}\nnot json\n{"type":"tool_use","part":{"tool":"bash","state":{"input":{"command":"ls"}}}}\n'
        '{"type":"text","part":{"text":"done"}}\n{"type":"step_finish","part":{"tokens":{"total":12}}}\n{"broken'
    )
    assert (opencode.steps, opencode.tool_calls[0][0], opencode.texts, opencode.tokens, opencode.malformed) == (1, "bash", ["done"], 12, 1)
    pi = parse_pi_events(
        '{"type":"turn_start"}\n{"type":"tool_execution_start","toolName":"bash","args":{"command":"ls"}}\n'
        '{"type":"message_end","message":{"role":"assistant","content":[{"type":"text","text":"ok"}],"usage":{"totalTokens":5}}}\n'
    )
    assert (pi.steps, pi.tool_calls[0][0], pi.texts, pi.tokens) == (1, "bash", ["ok"], 5)
    terminus = parse_terminus_events('{"type":"turn"}\n{"type":"command","command":"ls"}\n{"type":"final","text":"bye"}\n')
    assert (terminus.steps, terminus.tool_calls, terminus.texts) == (1, [("terminal", "ls")], ["bye"])


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=3000))
def test_parsers_never_raise(text: str) -> None:
    for parse in PARSERS:
        assert isinstance(parse(text), AgentReport)
        assert isinstance(parse("{" + text), AgentReport)


@settings(max_examples=20, deadline=None)
@given(st.integers(min_value=65, max_value=300_000), st.sampled_from(["{", '{"type":', '{"a":[']))
def test_parsers_bounded_on_deep_nesting(depth: int, opener: str) -> None:
    for parse in PARSERS:
        report = parse(opener * depth + "\n" + '{"type":"turn"}\n' + "[" * depth)
        assert (report.malformed, report.events) == (1, 1)
