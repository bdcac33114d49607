"""The rollout graph and the training trace, from calls made through the real relay to the fake engine (whose
prompt ids are its chat rendering of the messages, so they extend by prefix as a real engine's do).

The trace is checked by OpenEnv 0.10's own `TrainingTrace` in its virtualenv (tests/compat's cached venv)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI

from coding_agent_env.llm import Relay
from coding_agent_env.llm.trace import annotate, trace_entries, training_data
from coding_agent_env.models import Mode, TrainingData, Turn
from tests.compat.conftest import gen_b  # noqa: F401 (a fixture)
from tests.fakes.llm import FakeLLMServer, Reply
from tests.llm.conftest import upstream_for

SYSTEM = {"role": "system", "content": "You are a coding agent."}
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
BASH = ("bash", '{"command": "ls",  "cwd": "."}')
VALIDATE = """
import json, sys
from openenv.core.harness.training import TrainingTrace
trace = TrainingTrace.model_validate(json.load(sys.stdin))
print(json.dumps([[t.node_id, sum(t.loss_mask)] for t in trace.turns]))
"""


def openenv_validates(python: Path, trace: dict[str, Any]) -> list[list[Any]]:
    done = subprocess.run([str(python), "-c", VALIDATE], input=json.dumps(trace), capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


async def ask(llm: AsyncOpenAI, messages: list[dict[str, Any]], *, tools: bool = True, stream: bool = False) -> Any:
    extra: dict[str, Any] = {"tools": TOOLS} if tools else {}
    if stream:
        chunks = [c async for c in await llm.chat.completions.create(model="m", messages=messages, stream=True,  # type: ignore[call-overload]
                                                                      **extra)]
        return chunks
    return (await llm.chat.completions.create(model="m", messages=messages, **extra)).choices[0].message  # type: ignore[call-overload]


def echo(message: Any) -> dict[str, Any]:
    """The assistant message as an agent sends it back: tool-call arguments re-serialised compactly."""
    out: dict[str, Any] = {"role": "assistant", "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function", "function": {
            "name": c.function.name, "arguments": json.dumps(json.loads(c.function.arguments), separators=(",", ":"))}}
            for c in message.tool_calls]
    return out


async def scripted_rollout(relay: Relay, fake: FakeLLMServer, **fake_options: Any) -> list[Turn]:
    """A title call, the agent's line with a retried call, then a compaction that restarts the conversation."""
    fake.app.reset([
        Reply(content="Binary search"),                      # 0 title (no tools)
        Reply(content="Looking", tool_calls=(BASH,)),        # 1 main
        Reply(content="garbled", tool_calls=(BASH,)),        # 2 retried: the agent discards it
        Reply(content="Writing it", tool_calls=(BASH,)),     # 3 main, the retry's sibling
        Reply(content="Summary of the work"),                # 4 compaction summary (no tools): auxiliary
        Reply(content="Done now"),                           # 5 the compacted conversation: compaction root
    ])
    for key, value in fake_options.items():
        setattr(fake.app, key, value)
    lease = await relay.open_lease("r", upstream_for(fake, mode=Mode.TRANSPARENT_PROXY, top_logprobs=1,
                                                     token_ids=True))
    user = {"role": "user", "content": "Write binary_search.py please"}
    async with AsyncOpenAI(base_url=lease.base_url, api_key=lease.token, max_retries=0) as llm:
        await ask(llm, [{"role": "system", "content": "Make a title."}, user], tools=False)
        history = [SYSTEM, user]
        first = await ask(llm, history, stream=True)
        call_id = next(c.choices[0].delta.tool_calls[0].id for c in first
                       if c.choices and c.choices[0].delta.tool_calls)
        history.append({"role": "assistant", "content": "Looking", "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": "bash", "arguments": '{"command":"ls","cwd":"."}'}}]})
        history.append({"role": "tool", "tool_call_id": call_id, "content": "a.txt"})
        await ask(llm, history)  # retried
        third = await ask(llm, history)
        history += [echo(third), {"role": "tool", "tool_call_id": third.tool_calls[0].id, "content": "written"}]
        await ask(llm, [*history, {"role": "user", "content": "Summarise the conversation."}], tools=False)
        await ask(llm, [SYSTEM, {"role": "user", "content": "Summary of the work. Continue."}])
    turns = lease.turns()
    await lease.close()
    return turns


async def test_graph_shapes_title_retry_and_compaction(relay: Relay, fake: FakeLLMServer, gen_b: Path) -> None:  # noqa: F811
    turns, graph = annotate(await scripted_rollout(relay, fake), "r")
    shape = [(t.turn, t.parent, t.purpose, t.trainable) for t in turns]
    assert shape == [
        (0, None, "auxiliary", False),
        (1, None, "main", True),
        (2, 1, "retry", False),
        (3, 1, "main", True),
        (4, 3, "auxiliary", False),
        (5, None, "compaction", True),
    ]
    assert all(t.note for t in turns if not t.trainable) and turns[2].note == "a retry call"
    data = training_data(graph, rollout_id="r", task_id="t", reward=None)
    assert data.reward is None
    assert openenv_validates(gen_b, data.trace) == [
        ["r:0", 0], ["r:1", len(turns[1].completion_token_ids)], ["r:2", 0],
        ["r:3", len(turns[3].completion_token_ids)], ["r:4", 0], ["r:5", len(turns[5].completion_token_ids)]]
    paths = {tuple(s.node_ids): s for s in data.sequences}
    assert set(paths) == {("r:0",), ("r:1", "r:2"), ("r:1", "r:3", "r:4"), ("r:5",)}
    main = paths[("r:1", "r:3", "r:4")]
    # One sequence: the leaf's prompt holds turn 1's and turn 3's prompts and completions, unre-tokenised.
    assert main.input_ids[: len(turns[3].prompt_token_ids or [])] == turns[3].prompt_token_ids
    trained = [i for i, m in enumerate(main.loss_mask) if m]
    assert len(trained) == len(turns[1].completion_token_ids) + len(turns[3].completion_token_ids)
    assert [main.input_ids[i] for i in trained] == turns[1].completion_token_ids + turns[3].completion_token_ids
    assert [main.logprobs[i] for i in trained] == turns[1].per_token_logps + turns[3].per_token_logps


async def test_trace_entries_carry_the_whole_request(relay: Relay, fake: FakeLLMServer) -> None:
    turns, graph = annotate(await scripted_rollout(relay, fake), "r")
    entries = trace_entries(turns, training_data(graph, rollout_id="r", task_id="t", reward=0.5), 0.5)
    third = entries[3]
    assert [m["role"] for m in third["request"]["messages"]] == ["system", "user", "assistant", "tool"]
    assert third["request"]["tools"] == TOOLS and entries[0]["request"]["tools"] is None
    assert third["response"]["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "bash"
    assert len(third["loss_mask"]) == len(third["prompt_token_ids"]) + len(third["completion_token_ids"])
    assert third["reward"] == 0.5 and third["metadata"]["node_id"] == "r:3" and third["metadata"]["parent"] == "r:1"


async def test_token_strings_as_ids_give_the_ids(relay: Relay, fake: FakeLLMServer) -> None:
    """vLLM's `--return-tokens-as-token-ids` without `token_ids`: ids are read from the `token_id:N` strings."""
    plain = await scripted_rollout(relay, fake, tokens_as_ids=True, omit_token_ids=False)
    assert all(t.completion_tokens == [f"token_id:{i}" for i in t.completion_token_ids] for t in plain)


@pytest.mark.parametrize("fault", ["nan", "short", "positive"])
async def test_bad_logprobs_stay_as_context(relay: Relay, fake: FakeLLMServer, gen_b: Path, fault: str) -> None:  # noqa: F811
    fake.app.reset([Reply(content="fine", tool_calls=(BASH,)), Reply(content="broken logprobs", logprobs_fault=fault)])  # type: ignore[arg-type]
    lease = await relay.open_lease("r", upstream_for(fake, mode=Mode.TRANSPARENT_PROXY, top_logprobs=1, token_ids=True))
    async with AsyncOpenAI(base_url=lease.base_url, api_key=lease.token, max_retries=0) as llm:
        first = await ask(llm, [SYSTEM, {"role": "user", "content": "go"}])
        await ask(llm, [SYSTEM, {"role": "user", "content": "go"}, echo(first),
                        {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "ok"}], stream=True)
    turns, graph = annotate(lease.turns(), "r")
    await lease.close()
    assert [(t.parent, t.trainable) for t in turns] == [(None, True), (0, False)] and turns[1].note
    data = training_data(graph, rollout_id="r", task_id="t", reward=1.0)
    assert openenv_validates(gen_b, data.trace)[1] == ["r:1", 0]
    assert data.reward == 1.0 and data.trace["turns"][1]["metadata"]["note"] == turns[1].note
    # the time split per call: each turn's LLM latency and start, as the relay measured them
    assert [(t["metadata"]["latency_s"], t["metadata"]["timestamp"]) for t in data.trace["turns"]] == [
        (round(turn.latency_s, 6), turn.timestamp) for turn in turns]


async def test_ids_for_some_turns_only(relay: Relay, fake: FakeLLMServer, gen_b: Path) -> None:  # noqa: F811
    """Calls without prompt ids are linked by messages, kept out of the training trace and never trainable."""
    fake.app.reset([Reply(content="one", tool_calls=(BASH,)), Reply(content="two")])
    lease = await relay.open_lease("r", upstream_for(fake, mode=Mode.TRANSPARENT_PROXY, top_logprobs=1, token_ids=True))
    async with AsyncOpenAI(base_url=lease.base_url, api_key=lease.token, max_retries=0) as llm:
        first = await ask(llm, [SYSTEM, {"role": "user", "content": "go"}])
        fake.app.omit_token_ids = True
        await ask(llm, [SYSTEM, {"role": "user", "content": "go"}, echo(first),
                        {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "ok"}])
    turns, graph = annotate(lease.turns(), "r")
    await lease.close()
    assert [(t.trainable, t.note) for t in turns] == [(True, None), (False, "the upstream returned no valid prompt token ids")]
    data = training_data(graph, rollout_id="r", task_id="t", reward=None)
    assert [row[0] for row in openenv_validates(gen_b, data.trace)] == ["r:0"]


def test_message_fallback_matches_tool_arguments_as_json() -> None:
    """Without ids, a call continues another when its messages extend the other's messages plus reply, with tool
    arguments compared as JSON (agents re-serialise them)."""
    tool = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"a": 1, "b": [2]}'}}
    reply = Turn(turn=0, request_messages=[SYSTEM], request_tools=TOOLS,
                 message={"content": "x", "tool_calls": [{"id": "c1", "name": "bash", "arguments": '{"a": 1, "b": [2]}'}]})
    again = {**tool, "function": {"name": "bash", "arguments": '{"a":1,"b":[2]}'}}
    follow = Turn(turn=1, request_messages_reused=1, request_tools_reused=True,
                  request_messages=[{"role": "assistant", "content": "x", "tool_calls": [again]},
                                    {"role": "tool", "tool_call_id": "c1", "content": "out"}])
    turns, _ = annotate([reply, follow], "r")
    assert [(t.parent, t.purpose, t.trainable) for t in turns] == [(None, "main", False), (0, "main", False)]


def test_no_calls_no_training_data() -> None:
    turns, graph = annotate([], "r")
    assert turns == [] and training_data(graph, rollout_id="r", task_id="", reward=None) == TrainingData(
        trace={"schema_version": 1, "turns": []}, sequences=[], reward=None)
