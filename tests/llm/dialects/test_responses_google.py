"""The Responses and Google generateContent dialects as pure translations, and through the real relay to the fake
engine. Codex and Gemini CLI run them for real in the agent suite (tests/agents)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coding_agent_env.llm.dialects import google, responses
from coding_agent_env.llm.dialects.anthropic import DialectError
from tests.fakes.llm import Reply
from tests.llm.conftest import upstream_for
from tests.llm.dialects.test_anthropic import chunks_of


def sse(data: bytes) -> list[tuple[str | None, dict[str, Any]]]:
    out = []
    for frame in data.decode().split("\n\n"):
        if not frame.strip():
            continue
        name = None
        for line in frame.splitlines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                out.append((name, json.loads(line[6:])))
    return out


def test_responses_request_translates() -> None:
    chat = responses.to_chat({
        "model": "m", "instructions": "Be brief.", "stream": True, "max_output_tokens": 64, "store": False,
        "reasoning": {"summary": "auto"}, "include": ["reasoning.encrypted_content"], "tool_choice": "auto",
        "tools": [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
                  {"type": "web_search"}, {"type": "namespace", "name": "kit", "tools": []}],
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "rules"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                            {"type": "input_text", "text": "b"}]},
            {"type": "reasoning", "summary": []},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
            {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": '{"cmd":"ls"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
        ],
    })
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."}, {"role": "system", "content": "rules"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": "ok", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "exec_command", "arguments": '{"cmd":"ls"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
    ]
    assert [t["function"]["name"] for t in chat["tools"]] == ["exec_command"] and chat["max_tokens"] == 64
    for bad, match in (({"input": [], "previous_response_id": "r"}, "previous_response_id"),
                       ({"input": [{"type": "message", "role": "user",
                                    "content": [{"type": "input_image"}]}]}, "input_image"),
                       ({"input": [], "frobnicate": 1}, "frobnicate"),
                       ({"input": [], "tools": [{"type": "custom", "name": "x"}]}, "only function tools")):
        with pytest.raises(DialectError, match=match):
            responses.to_chat(bad)


@settings(max_examples=40, deadline=None)
@given(text=st.text(max_size=30), commands=st.lists(st.text(max_size=15), max_size=3),
       cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=5))
def test_a_responses_stream_ends_with_the_whole_translation(text: str, commands: list[str], cuts: list[int]) -> None:
    calls = [("exec_command", json.dumps({"cmd": c})) for c in commands]
    stream = responses.ResponsesStream("m")
    data = b"".join(stream.feed(c) for c in chunks_of(text, calls, cuts)) + stream.finish()
    events = sse(data)
    assert [name for name, _ in events][:2] == ["response.created", "response.in_progress"]
    assert events[-1][0] == "response.completed"
    assert [e["sequence_number"] for _, e in events] == list(range(len(events)))
    final = events[-1][1]["response"]
    whole = responses.response_from_chat({"choices": [{"finish_reason": "tool_calls" if calls else "stop", "message": {
        "content": text or None, "tool_calls": [{"id": f"c{i}", "function": {"name": n, "arguments": a}}
                                                for i, (n, a) in enumerate(calls)]}}]}, "m")
    strip = lambda items: [{k: v for k, v in item.items() if k != "id"} for item in items]  # noqa: E731
    assert strip(final["output"]) == strip(whole["output"])
    done = [e["item"] for name, e in events if name == "response.output_item.done"]
    assert strip(done) == strip(final["output"])


def test_google_request_and_response_translate() -> None:
    assert google.parse_path("/v1beta/models/fake/coder-1:streamGenerateContent") == ("fake/coder-1", True)
    assert google.parse_path("/v1beta/models/m:countTokens") is None
    chat = google.to_chat({
        "systemInstruction": {"parts": [{"text": "sys"}]},
        "generationConfig": {"maxOutputTokens": 9, "temperature": 0, "thinkingConfig": {}},
        "tools": [{"functionDeclarations": [{"name": "run_shell_command",
                                             "parameters": {"type": "OBJECT", "properties": {"command": {"type": "STRING"}}}}]}],
        "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["run_shell_command"]}},
        "contents": [
            {"role": "user", "parts": [{"text": "hi"}]},
            {"role": "model", "parts": [{"text": "sure", "thought": True}, {"text": "ok"},
                                        {"functionCall": {"name": "run_shell_command", "args": {"command": "ls"}}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "run_shell_command", "response": {"output": "a"}}}]},
        ],
    }, "m", stream=True)
    [call] = chat["messages"][2]["tool_calls"]
    assert chat["messages"][:2] == [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    assert chat["messages"][2]["content"] == "ok" and json.loads(call["function"]["arguments"]) == {"command": "ls"}
    assert chat["messages"][3] == {"role": "tool", "tool_call_id": call["id"], "content": '{"output": "a"}'}
    assert chat["tools"][0]["function"]["parameters"]["properties"]["command"]["type"] == "string"
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "run_shell_command"}}
    assert (chat["max_tokens"], chat["stream"]) == (9, True)
    answer = google.response_from_chat({"usage": {"prompt_tokens": 3, "completion_tokens": 2}, "choices": [
        {"finish_reason": "length", "message": {"content": "x", "tool_calls": [
            {"id": "c", "function": {"name": "f", "arguments": "[1]"}}]}}]}, "m")
    assert answer["candidates"][0]["content"]["parts"] == [
        {"text": "x"}, {"functionCall": {"id": "c", "name": "f", "args": {"arguments": "[1]"}}}]
    assert answer["candidates"][0]["finishReason"] == "MAX_TOKENS" and answer["usageMetadata"]["totalTokenCount"] == 5
    with pytest.raises(DialectError, match="media parts"):
        google.to_chat({"contents": [{"role": "user", "parts": [{"inlineData": {}}]}]}, "m", stream=False)


async def test_the_relay_speaks_responses_and_google(relay: Any, fake: Any) -> None:
    fake.app.reset([Reply(content="hello", tool_calls=(("run", '{"cmd": "ls"}'),))])
    lease = await relay.open_lease("r", upstream_for(fake))
    root = lease.base_url.removesuffix("/v1")
    async with httpx.AsyncClient(timeout=30) as http:
        body = {"model": "m", "input": "hi", "stream": True,
                "tools": [{"type": "function", "name": "run", "parameters": {"type": "object"}}]}
        async with http.stream("POST", root + "/v1/responses", json=body,
                               headers={"authorization": f"Bearer {lease.token}"}) as answer:
            events = sse(b"".join([c async for c in answer.aiter_bytes()]))
        final = events[-1][1]["response"]
        assert [o["type"] for o in final["output"]] == ["message", "function_call"]
        assert final["output"][1]["arguments"] == '{"cmd": "ls"}'
        whole = (await http.post(root + "/v1beta/models/fake/m:generateContent", headers={"x-goog-api-key": lease.token},
                                 json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]})).json()
        assert whole["candidates"][0]["content"]["parts"][1]["functionCall"]["args"] == {"cmd": "ls"}
        denied = await http.post(root + "/v1beta/models/m:generateContent", headers={"x-goog-api-key": "car-no"},
                                 json={"contents": []})
        assert denied.status_code == 401 and denied.json()["error"]["status"] == "UNAUTHENTICATED"
    assert len(lease.turns()) == 2 and len(fake.app.requests) == 2
    await lease.close()
