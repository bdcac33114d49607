"""The Anthropic Messages dialect as a pure translation (no I/O): requests to chat completions, chat responses and
streamed chunks back to Messages responses and events. The relay and Claude Code run it for real in the agent
suite (tests/agents)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coding_agent_env.llm.dialects import anthropic
from coding_agent_env.llm.dialects.anthropic import AnthropicStream, DialectError, response_from_chat, to_chat

TOOLS = [{"name": "Bash", "description": "run", "input_schema": {"type": "object", "properties": {}}}]


def test_a_conversation_with_tools_translates_to_chat() -> None:
    body = {
        "model": "m", "max_tokens": 100, "stream": True, "temperature": 0.5, "stop_sequences": ["END"],
        "system": [{"type": "text", "text": "You are "}, {"type": "text", "text": "an agent."}],
        "tools": TOOLS, "tool_choice": {"type": "any"}, "metadata": {"user_id": "u"}, "thinking": {"type": "adaptive"},
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "<reminder>"}, {"type": "text", "text": "Do it."}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "s"}, {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                          "content": [{"type": "text", "text": "a.txt"}]},
                                         {"type": "text", "text": "go on"}]},
            {"role": "system", "content": "mid-conversation note"},
        ],
    }
    chat = to_chat(body)
    assert chat["messages"] == [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": [{"type": "text", "text": "<reminder>"}, {"type": "text", "text": "Do it."}]},
        {"role": "assistant", "content": "Looking.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "ls"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "a.txt"},
        {"role": "user", "content": "go on"},
        {"role": "system", "content": "mid-conversation note"},
    ]
    assert chat["tools"] == [{"type": "function", "function": {"name": "Bash", "description": "run",
                                                               "parameters": {"type": "object", "properties": {}}}}]
    assert (chat["tool_choice"], chat["max_tokens"], chat["stop"], chat["temperature"]) == ("required", 100, ["END"], 0.5)
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}
    assert to_chat({**body, "tool_choice": {"type": "tool", "name": "Bash"}})["tool_choice"] == {
        "type": "function", "function": {"name": "Bash"}}


@pytest.mark.parametrize(("body", "match"), [
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "image blocks are not supported"),
    ({"messages": [], "frobnicate": 1}, "unsupported Messages field.*frobnicate"),
    ({"messages": [{"role": "tool", "content": "x"}]}, r"messages\[0\]: role"),
    ({"messages": [{"role": "user", "content": [{"type": "video"}]}]}, "unsupported content block 'video'"),
    ({"messages": [], "tools": [{"type": "web_search_20250305", "name": "web"}]}, "server tool"),
    ({"messages": "hi"}, "messages must be a list"),
])
def test_what_cannot_be_translated_is_refused_clearly(body: dict[str, Any], match: str) -> None:
    with pytest.raises(DialectError, match=match):
        to_chat(body)


def test_a_whole_response_translates_back() -> None:
    chat = {"model": "m", "usage": {"prompt_tokens": 7, "completion_tokens": 3}, "choices": [{
        "finish_reason": "tool_calls", "message": {"content": "Sure.", "tool_calls": [
            {"id": "c1", "function": {"name": "Bash", "arguments": '{"command": "ls"}'}},
            {"id": "c2", "function": {"name": "Bash", "arguments": "not json"}}]}}]}
    answer = response_from_chat(chat, "m")
    assert answer["content"] == [
        {"type": "text", "text": "Sure."},
        {"type": "tool_use", "id": "c1", "name": "Bash", "input": {"command": "ls"}},
        {"type": "tool_use", "id": "c2", "name": "Bash", "input": {"arguments": "not json"}},
    ]
    assert (answer["stop_reason"], answer["usage"]) == ("tool_use", {"input_tokens": 7, "output_tokens": 3})
    for finish, stop in (("stop", "end_turn"), ("length", "max_tokens"), ("content_filter", "end_turn")):
        assert response_from_chat({"choices": [{"finish_reason": finish, "message": {}}]}, "m")["stop_reason"] == stop
    assert anthropic.error_body(401, "no")["error"]["type"] == "authentication_error"


def events(data: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for frame in data.decode().split("\n\n"):
        if frame.strip():
            name, payload = frame.split("\n", 1)
            out.append((name.removeprefix("event: "), json.loads(payload.removeprefix("data: "))))
    return out


def reassemble(stream: list[tuple[str, dict[str, Any]]]) -> tuple[list[dict[str, Any]], str | None]:
    """Content blocks and the stop reason, rebuilt from a Messages event stream as a client does."""
    blocks: list[dict[str, Any]] = []
    partial: dict[int, str] = {}
    stop = None
    for name, event in stream:
        if name == "content_block_start":
            assert event["index"] == len(blocks)
            blocks.append(dict(event["content_block"]))
        elif name == "content_block_delta":
            delta = event["delta"]
            if delta["type"] == "text_delta":
                blocks[event["index"]]["text"] += delta["text"]
            else:
                partial[event["index"]] = partial.get(event["index"], "") + delta["partial_json"]
        elif name == "content_block_stop":
            if event["index"] in partial:
                blocks[event["index"]]["input"] = json.loads(partial[event["index"]])
        elif name == "message_delta":
            stop = event["delta"]["stop_reason"]
    return blocks, stop


def chunks_of(text: str, calls: list[tuple[str, str]], cuts: list[int]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"model": "m", "choices": [{"index": 0, "delta": {"role": "assistant"}}]}]
    start = 0
    for cut in [*sorted(c % (len(text) + 1) for c in cuts), len(text)]:
        if cut > start:
            out.append({"choices": [{"index": 0, "delta": {"content": text[start:cut]}}]})
            start = cut
    for i, (name, arguments) in enumerate(calls):
        half = len(arguments) // 2
        out.append({"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": i, "id": f"c{i}", "function": {"name": name, "arguments": arguments[:half]}}]}}]})
        out.append({"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": i, "function": {"arguments": arguments[half:]}}]}}]})
    out.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls" if calls else "stop"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 9}})
    return out


@settings(max_examples=60, deadline=None)
@given(
    text=st.text(min_size=0, max_size=40),
    commands=st.lists(st.text(max_size=20), max_size=3),
    cuts=st.lists(st.integers(min_value=0, max_value=60), max_size=6),
)
def test_a_stream_reassembles_to_the_whole_translation(text: str, commands: list[str], cuts: list[int]) -> None:
    calls = [("Bash", json.dumps({"command": c})) for c in commands]
    stream = AnthropicStream("m")
    data = b"".join(stream.feed(chunk) for chunk in chunks_of(text, calls, cuts)) + stream.finish()
    frames = events(data)
    names = [name for name, _ in frames]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert names.count("content_block_start") == names.count("content_block_stop")
    whole = response_from_chat({"choices": [{"finish_reason": "tool_calls" if calls else "stop", "message": {
        "content": text or None,
        "tool_calls": [{"id": f"c{i}", "function": {"name": n, "arguments": a}} for i, (n, a) in enumerate(calls)]}}]},
        "m")
    blocks, stop = reassemble(frames)
    assert blocks == whole["content"] and stop == whole["stop_reason"]
    assert frames[-2][1]["usage"] == {"output_tokens": 9}
    assert stream.finish() == b""


def test_a_stream_that_ends_without_a_finish_reason_is_closed() -> None:
    stream = AnthropicStream("m")
    data = stream.feed({"choices": [{"index": 0, "delta": {"content": "half"}}]}) + stream.finish()
    names = [name for name, _ in events(data)]
    assert names == ["message_start", "content_block_start", "content_block_delta", "content_block_stop",
                     "message_delta", "message_stop"]


async def test_the_relay_speaks_messages_and_records_the_turn(relay: Any, fake: Any) -> None:
    """Through the real relay to the fake engine: whole and streamed, errors in Anthropic's shape."""
    import httpx

    from tests.fakes.llm import Reply
    from tests.llm.conftest import upstream_for

    fake.app.reset([Reply(content="hello there", tool_calls=(("Bash", '{"command": "ls"}'),))])
    lease = await relay.open_lease("r", upstream_for(fake))
    url = lease.base_url.removesuffix("/v1") + "/v1/messages?beta=true"
    body = {"model": "m", "max_tokens": 50, "tools": TOOLS, "messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient(timeout=30) as http:
        whole = (await http.post(url, json=body, headers={"x-api-key": lease.token})).json()
        assert whole["type"] == "message" and whole["stop_reason"] == "tool_use"
        assert [b["type"] for b in whole["content"]] == ["text", "tool_use"] and whole["content"][1]["input"] == {
            "command": "ls"}
        async with http.stream("POST", url, json={**body, "stream": True},
                               headers={"authorization": f"Bearer {lease.token}"}) as streamed:
            data = b"".join([chunk async for chunk in streamed.aiter_bytes()])
        blocks, stop = reassemble(events(data))
        assert blocks == whole["content"][:1] + [{**whole["content"][1], "id": blocks[1]["id"]}] and stop == "tool_use"
        bad = await http.post(url, json={**body, "messages": [{"role": "user", "content": [{"type": "image"}]}]},
                              headers={"x-api-key": lease.token})
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
        denied = await http.post(url, json=body, headers={"x-api-key": "car-nope"})
        assert denied.status_code == 401 and denied.json()["type"] == "error"
    turns = lease.turns()
    assert len(turns) == 2 and all(t.message.tool_calls[0].name == "Bash" for t in turns)
    assert len(fake.app.requests) == 2 and fake.app.requests[0].body["messages"] == [{"role": "user", "content": "hi"}]
    await lease.close()
