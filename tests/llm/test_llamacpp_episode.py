"""An interactive episode driven by a real engine: llama.cpp's `llama-server` serving SmolLM2-135M-Instruct is the
policy, a real server of ours (uvicorn in a thread, the local backend with bubblewrap) the environment, and
`CodingEnvironment` (what a trainer's `environment_factory` makes) the client between them: `reset` starts the
episode, each command the model gives runs through the episode's `terminal`, `get_reward` gives the final answer.

Skips, saying why, until llama-server is built (tests/llm/conftest.py's `llama_server` fixture)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from coding_agent_env.episode.terminal import TERMINAL_DESCRIPTION, TERMINAL_SCHEMA, TERMINAL_TOOL
from coding_agent_env.harness import CodingEnvironment
from coding_agent_env.settings import Settings
from tests.helpers import leftovers, wait_until
from tests.llm.llamacpp_server import MODEL_NAME
# Fixtures: the engine (session-scoped, skips until built) and settings whose sandbox uids reach their roots.
from tests.llm.test_llamacpp import settings  # noqa: F401
from tests.protocol.live import LiveServer

TASK: dict[str, Any] = {
    "instruction": "Create a file named hello.txt containing hello.",
    "verify": ["grep -q hello hello.txt"],
    "sandbox": "local",
    "command_timeout_s": 10,  # a model's prose run as a command must not hold the shell for long
}
TOOL = {"type": "function", "function": {"name": TERMINAL_TOOL, "description": TERMINAL_DESCRIPTION,
                                         "parameters": TERMINAL_SCHEMA}}
"""The `terminal` tool as an OpenAI tool, of the constants the server lists it from (api/tools/terminal.py)."""
MAX_TURNS = 3
MAX_TOKENS = 48  # a command fits; 2 cores generate a few dozen tokens a second
ENGINE_BUDGET_S = 60.0  # all engine calls together; another suite may share the 2 cores with its own llama-server


@dataclass
class Ran:
    """One command the episode ran: where it came from (`tool_call`, or `text`: a reply without a usable tool
    call, run as it stands) and what the server answered."""

    source: str
    command: str
    output: str


@pytest.fixture
def live(settings: Settings) -> Iterator[LiveServer]:  # noqa: F811 (the imported fixture)
    server = LiveServer(settings).start()
    try:
        yield server
    finally:
        server.stop()


def chat(engine: str, messages: list[dict[str, Any]], deadline: float) -> dict[str, Any]:
    """One non-streamed call to llama-server's OpenAI route, answered before `deadline` or the test fails."""
    left = deadline - time.monotonic()
    assert left > 0, f"the engine budget ({ENGINE_BUDGET_S:g} s) was spent"
    reply = httpx.post(f"{engine}/v1/chat/completions", timeout=left, json={
        "model": MODEL_NAME, "messages": messages, "tools": [TOOL], "temperature": 0, "max_tokens": MAX_TOKENS,
        "stream": False})
    assert reply.status_code == 200, reply.text[:500]
    return reply.json()["choices"][0]["message"]


def terminal_arguments(call: dict[str, Any]) -> dict[str, Any] | None:
    """The arguments of a well-formed `terminal` call (an object of strings), else None."""
    function = call.get("function") or {}
    if function.get("name") != TERMINAL_TOOL:
        return None
    try:
        arguments = json.loads(function.get("arguments") or "")
    except json.JSONDecodeError:
        return None
    if not isinstance(arguments, dict) or not all(isinstance(v, str) for v in arguments.values()):
        return None
    return arguments


def test_an_episode_driven_by_llamacpp_goes_through(llama_server: str, live: LiveServer,  # noqa: F811
                                                    settings: Settings) -> None:  # noqa: F811
    """The loop a trainer runs: the instruction `reset` returns is the user message, the `terminal` tool is
    offered, each `terminal` call the model makes runs in the episode's sandbox and its output goes back as the
    tool's result, for at most MAX_TURNS turns; then `get_reward` gives the final answer and the server verifies.

    What this proves is the path, not the model's skill. A reply without a well-formed `terminal` call with a
    command (prose, a malformed call) has its text run as the command, marked `text`, and its output given back
    as a user message: every turn still reaches the sandbox through the episode, so the episode is driven by what
    the engine produced either way, and what the model did is printed. (SmolLM2-135M at temperature 0 makes no
    tool call here: it answers with Markdown code fences, which the shell runs as empty command substitutions,
    exit code 0, so the task is not solved and the reward is 0.) A `terminal` call with only a final answer ends
    the loop (`get_reward` then answers). Asserted: every command sent ran on the server, as the episode's own
    report lists them, and there was one at least (a first reply with neither a command nor any text fails the
    test: no path was shown); the reward is a number in [0, 1] from a completed verify, not the unscored
    fallback; after `close` the server holds no session and the sandbox left nothing behind."""
    started = time.monotonic()
    env = CodingEnvironment(live.http, message_timeout_s=60)
    try:
        instruction = env.reset(**TASK)
        assert instruction.startswith(TASK["instruction"]) and env.report is not None, instruction
        assert env.report["status"] == "running", env.report
        assert live.sessions.active == 1
        messages: list[dict[str, Any]] = [{"role": "user", "content": instruction}]
        ran: list[Ran] = []
        answered = False
        deadline = time.monotonic() + ENGINE_BUDGET_S
        for turn in range(MAX_TURNS):
            if turn and deadline - time.monotonic() < ENGINE_BUDGET_S / (2 * MAX_TURNS):
                break  # too little left for another turn on a loaded machine; the first always runs
            message = chat(llama_server, messages, deadline)
            calls = message.get("tool_calls") or []
            content = message.get("content") or ""
            usable = [(call, arguments) for call in calls if (arguments := terminal_arguments(call)) is not None
                      and (arguments.get("command", "").strip() or arguments.get("final_answer", "").strip())]
            if usable:
                messages.append({"role": "assistant", "content": content, "tool_calls": calls})
                for call in calls:  # every call gets its result; a malformed one beside usable ones runs nothing
                    if all(call is not other for other, _ in usable):
                        messages.append({"role": "tool", "tool_call_id": call.get("id", ""),
                                         "content": "Error: not run (give a command or a final_answer)"})
                for call, arguments in usable:
                    command = arguments.get("command", "")
                    if not command.strip():  # only a final answer: the model is done
                        answered = True
                        messages.append({"role": "tool", "tool_call_id": call.get("id", ""),
                                         "content": "final answer taken"})
                        continue
                    output = env.terminal(command)
                    ran.append(Ran("tool_call", command, output))
                    messages.append({"role": "tool", "tool_call_id": call.get("id", ""), "content": output})
                if answered:
                    break
                continue
            # No usable call: the reply's own text (its prose, or a malformed call's raw arguments) is the command.
            text = (content or " ".join((c.get("function") or {}).get("arguments") or "" for c in calls)).strip()
            messages.append({"role": "assistant", "content": content or text})
            if not text:
                break  # an empty reply: nothing to run, the model has nothing more to say
            output = env.terminal(text)
            ran.append(Ran("text", text, output))
            messages.append({"role": "user", "content": f"Output of that, run as a shell command:\n{output}"})

        reward = env.get_reward()
        report = env.report
        for step in ran:
            print(f"{step.source}: {step.command!r} -> {step.output[-200:]!r}")
        print(f"reward {reward}, answered by the model: {answered}, report status {report and report['status']}")

        assert ran, f"no command ran: the model's first reply gave neither a command nor text: {messages[1:]}"
        # Run, not refused: a command's output ends with its exit code or the timeout's note.
        assert all(re.search(r"\[(exit code -?\d+|timed out[^\n]*)\]$", s.output) for s in ran), [s.output for s in ran]
        assert report is not None and report["status"] == "completed", report
        # The server's own record: each command sent ran in the episode, in order, plus the final answer.
        assert [r["command"][:100] for r in report["commands"]] == [s.command[:100] for s in ran], report["commands"]
        assert report["step_count"] == len(ran) + 1, report
        assert isinstance(reward, float) and 0.0 <= reward <= 1.0 and env.reward == reward, (reward, report)
    finally:
        env.close()
    wait_until(lambda: live.sessions.active == 0 and not leftovers(settings),
               what=lambda: f"the session and its sandbox gone: {live.sessions.active} sessions, {leftovers(settings)}",
               timeout_s=30, interval_s=0.1)
    print(f"episode test: {time.monotonic() - started:.1f} s")
