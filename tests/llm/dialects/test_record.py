"""Reading a dialect's answers back (each `Dialect`'s `read` and `recorder`): for any chat completion, translating
it to a dialect (whole, or streamed in any chunking) and reading that back gives the same text, tool calls (name, id
where the dialect keeps one, and arguments as the same JSON), finish reason and usage, as far as the dialect
carries them."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coding_agent_env.llm.dialects import DIALECTS as REGISTRY
from coding_agent_env.llm.dialects import anthropic, google, responses
from coding_agent_env.llm.sse import SseParser
from tests.llm.dialects.test_anthropic import chunks_of

DIALECTS = {
    "anthropic": (anthropic.response_from_chat, anthropic.AnthropicStream),
    "responses": (responses.response_from_chat, responses.ResponsesStream),
    "google": (google.response_from_chat, google.GoogleStream),
}
KEEPS_IDS = {"anthropic", "responses", "google"}


def chat(text: str, calls: list[tuple[str, str]], finish: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = [{"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
                                 for i, (n, a) in enumerate(calls)]
    return {"model": "m", "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 9}}


def summary(completion: dict[str, Any]) -> tuple[Any, ...]:
    """What a round trip must keep: text, calls (id, name, parsed arguments), finish reason."""
    message = completion["choices"][0]["message"]
    calls = tuple((c["id"], c["function"]["name"], json.loads(c["function"]["arguments"] or "{}"))
                  for c in message.get("tool_calls") or [])
    return message.get("content") or None, calls, completion["choices"][0]["finish_reason"]


def expected_finish(dialect: str, finish: str, calls: list[tuple[str, str]]) -> str:
    """Anthropic names each chat reason; the others say only "length", and a call shows in the output."""
    if finish == "length" or dialect == "anthropic":
        return finish
        return "length"
    return "tool_calls" if calls else "stop"


calls_strategy = st.lists(st.builds(lambda name, command: (name, json.dumps({"command": command})),
                                    st.sampled_from(["Bash", "exec_command", "run_shell_command"]),
                                    st.text(max_size=20)), max_size=3)


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
@settings(max_examples=40, deadline=None)
@given(text=st.text(max_size=40), calls=calls_strategy, finish=st.sampled_from(["stop", "length", "tool_calls"]))
def test_a_whole_response_reads_back(dialect: str, text: str, calls: list[tuple[str, str]], finish: str) -> None:
    to_dialect, _ = DIALECTS[dialect]
    original = chat(text, calls, finish)
    back = REGISTRY[dialect].read(json.loads(json.dumps(to_dialect(original, "m"))))
    assert summary(back) == (text or None, tuple((f"c{i}", n, json.loads(a)) for i, (n, a) in enumerate(calls)),
                             expected_finish(dialect, finish, calls))
    assert back["usage"]["prompt_tokens"] == 5 and back["usage"]["completion_tokens"] == 9
    assert back["model"] == "m"


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
@settings(max_examples=40, deadline=None)
@given(text=st.text(max_size=40), calls=calls_strategy,
       cuts=st.lists(st.integers(min_value=0, max_value=60), max_size=6),
       byte_cuts=st.lists(st.integers(min_value=1, max_value=50), max_size=8))
def test_a_stream_reads_back_in_any_chunking(
    dialect: str, text: str, calls: list[tuple[str, str]], cuts: list[int], byte_cuts: list[int]
) -> None:
    _, stream_of = DIALECTS[dialect]
    stream = stream_of("m")
    data = b"".join(stream.feed(chunk) for chunk in chunks_of(text, calls, cuts)) + stream.finish()
    reader, parser = REGISTRY[dialect].recorder(), SseParser(1 << 20)
    position = 0
    for cut in [*byte_cuts, len(data)]:  # the bytes arrive cut anywhere, as from a socket
        for line in parser.feed(data[position:position + cut]):
            reader.feed(json.loads(line))
        position += cut
    back = reader.completion()
    assert summary(back) == (text or None, tuple((f"c{i}", n, json.loads(a)) for i, (n, a) in enumerate(calls)),
                             "tool_calls" if calls else "stop")
    assert back["usage"]["completion_tokens"] == 9


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
@given(junk=st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                         lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                     max_size=4)))
def test_any_json_is_read_without_raising(dialect: str, junk: Any) -> None:
    reader = REGISTRY[dialect].recorder()
    reader.feed(junk)
    for completion in (reader.completion(), REGISTRY[dialect].read(junk)):
        assert completion["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls", "content_filter")


def test_thinking_and_reasoning_are_kept_apart_from_the_answer() -> None:
    back = REGISTRY["anthropic"].read({"content": [{"type": "thinking", "thinking": "hmm"},
                                                   {"type": "text", "text": "done"}], "stop_reason": "end_turn"})
    message = back["choices"][0]["message"]
    assert (message["content"], message["reasoning_content"]) == ("done", "hmm")
    back = REGISTRY["google"].read({"candidates": [{"content": {"parts": [{"text": "plan", "thought": True},
                                                                         {"text": "ok"}]},
                                                   "finishReason": "SAFETY"}]})
    message = back["choices"][0]["message"]
    assert (message["content"], message["reasoning_content"]) == ("ok", "plan")
    assert back["choices"][0]["finish_reason"] == "content_filter"


def text_in(dialect: str, event: dict[str, Any]) -> str:
    """The answer text one streamed event carries, read plainly from the dialect's event shape."""
    if dialect == "anthropic":
        delta = event.get("delta") or {}
        return delta.get("text", "") if event.get("type") == "content_block_delta" else ""
    if dialect == "responses":
        return event.get("delta", "") if event.get("type") == "response.output_text.delta" else ""
    parts = [p for c in event.get("candidates") or [] for p in (c.get("content") or {}).get("parts") or []]
    return "".join(p.get("text", "") for p in parts if not p.get("thought"))


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
@settings(max_examples=40, deadline=None)
@given(text=st.text(min_size=1, max_size=40), calls=calls_strategy,
       cuts=st.lists(st.integers(min_value=0, max_value=60), max_size=6), keep=st.integers(min_value=0))
def test_a_stream_cut_short_keeps_the_text_that_arrived(
    dialect: str, text: str, calls: list[tuple[str, str]], cuts: list[int], keep: int
) -> None:
    """An agent hanging up mid-answer: the turn holds every text delta that came before it did."""
    _, stream_of = DIALECTS[dialect]
    stream = stream_of("m")
    data = b"".join(stream.feed(chunk) for chunk in chunks_of(text, calls, cuts)) + stream.finish()
    events = [json.loads(line) for line in SseParser(1 << 20).feed(data)]
    arrived = events[:keep % (len(events) + 1)]
    reader = REGISTRY[dialect].recorder()
    for event in arrived:
        reader.feed(event)
    content = reader.completion()["choices"][0]["message"]["content"] or ""
    assert content == "".join(text_in(dialect, event) for event in arrived)
