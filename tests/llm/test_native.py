"""Pass-through of an agent dialect to an upstream that serves it itself (`Dialect.native`), through the real relay.

The upstream is the scripted fake LLM serving the dialects natively (no real Anthropic, OpenAI or Google API
here; see `tests/fakes/llm.py`): what it receives is exactly what a native upstream would get from the relay."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from coding_agent_env.llm import Relay
from coding_agent_env.llm.dialects import DIALECTS
from coding_agent_env.llm.upstream import resolve_upstream
from coding_agent_env.models import RolloutRequest, Turn
from coding_agent_env.settings import LlmEndpoint, Settings
from tests.fakes.llm import FakeLLMServer, Reply
from tests.llm.conftest import SERVER_KEY, turn_after_hang_up, upstream_for

CALL = Reply(content="running it", tool_calls=(("Bash", '{"command": "ls"}'),))

# dialect -> (path on the relay, auth header for the relay token, body, how the answer names the tool call)
CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "anthropic": ("/v1/messages", "x-api-key", {
        "model": "claude-x", "max_tokens": 4000, "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"name": "Bash", "input_schema": {"type": "object"}}], "metadata": {"user_id": "u"}}),
    "responses": ("/v1/responses", "authorization", {
        "model": "gpt-x", "input": "hi", "max_output_tokens": 4000,
        "tools": [{"type": "function", "name": "Bash", "parameters": {"type": "object"}}], "store": False}),
    "google": ("/v1beta/models/gemini-x:generateContent", "x-goog-api-key", {
        "contents": [{"role": "user", "parts": [{"text": "hi"}]}], "generationConfig": {"maxOutputTokens": 4000},
        "tools": [{"functionDeclarations": [{"name": "Bash", "parameters": {"type": "OBJECT"}}]}]}),
}


def stream_path(dialect: str, path: str) -> tuple[str, dict[str, Any]]:
    """The streamed form of a case: Google by method and `alt=sse`, the others by `stream: true`."""
    if dialect == "google":
        return path.replace(":generateContent", ":streamGenerateContent") + "?alt=sse", {}
    return path, {"stream": True}


def auth(header: str, token: str) -> dict[str, str]:
    return {header: f"Bearer {token}" if header == "authorization" else token}


def called_tool(dialect: str, answer: dict[str, Any]) -> str:
    if dialect == "anthropic":
        return next(b["name"] for b in answer["content"] if b["type"] == "tool_use")
    if dialect == "responses":
        return next(i["name"] for i in answer["output"] if i["type"] == "function_call")
    return next(p["functionCall"]["name"] for p in answer["candidates"][0]["content"]["parts"] if "functionCall" in p)


@pytest.mark.parametrize("dialect", sorted(CASES))
async def test_a_native_dialect_passes_through_unchanged_and_is_recorded(
    dialect: str, relay: Relay, fake: FakeLLMServer
) -> None:
    fake.app.native = frozenset({dialect})
    fake.app.reset([CALL])
    path, header, body = CASES[dialect]
    lease = await relay.open_lease("r", upstream_for(fake, native_dialects=frozenset({dialect}), max_tokens_cap=64))
    root = lease.base_url.removesuffix("/v1")
    async with httpx.AsyncClient(timeout=30) as http:
        whole = await http.post(root + path, json=body, headers={**auth(header, lease.token),
                                                                 "anthropic-version": "2023-06-01"})
        assert whole.status_code == 200, whole.text
        assert called_tool(dialect, whole.json()) == "Bash"
        spath, extra = stream_path(dialect, path)
        async with http.stream("POST", root + spath, json={**body, **extra}, headers=auth(header, lease.token)) as s:
            assert s.status_code == 200 and s.headers["content-type"].startswith("text/event-stream")
            streamed = b"".join([chunk async for chunk in s.aiter_bytes()])
    await lease.close()

    # Upstream saw the dialect itself, not chat completions: the agent's body with the rollout's rules applied.
    seen = fake.app.requests
    upstream_path = {"google": "/v1/models/Qwen/Qwen3-4B:generateContent"}.get(dialect, path)  # base URL + resource
    assert [r.path.replace("streamGenerateContent", "generateContent") for r in seen] == [upstream_path] * 2
    first = seen[0]
    assert first.body is not None
    for field in set(body) - {"model", "max_tokens", "max_output_tokens", "generationConfig"}:
        assert first.body[field] == body[field]
    if dialect == "anthropic":
        assert first.body["model"] == "Qwen/Qwen3-4B" and first.body["max_tokens"] == 64
        assert first.headers["x-api-key"] == SERVER_KEY and first.headers["anthropic-version"] == "2023-06-01"
    elif dialect == "responses":
        assert first.body["model"] == "Qwen/Qwen3-4B" and first.body["max_output_tokens"] == 64
        assert first.headers["authorization"] == f"Bearer {SERVER_KEY}"
    else:
        assert first.body["generationConfig"] == {"maxOutputTokens": 64}
        assert first.headers["x-goog-api-key"] == SERVER_KEY
        assert seen[1].path.endswith(":streamGenerateContent")
    assert all(lease.token not in json.dumps(r.headers) + json.dumps(r.body) for r in seen)
    assert b"Bash" in streamed

    turns = lease.turns()
    assert [t.passthrough for t in turns] == [dialect, dialect] and [t.stream for t in turns] == [False, True]
    for turn in turns:
        assert turn.error is None and turn.upstream_status == 200
        assert turn.message.content == "running it"
        assert [(c.name, json.loads(c.arguments)) for c in turn.message.tool_calls] == [("Bash", {"command": "ls"})]
        assert turn.finish_reason == "tool_calls" and turn.usage is not None and turn.usage.completion_tokens > 0
    assert turns[0].request_messages == [{"role": "user", "content": "hi"}]


async def test_an_upstream_error_comes_back_as_the_upstream_sent_it(relay: Relay, fake: FakeLLMServer) -> None:
    fake.app.native = frozenset({"anthropic"})
    fake.app.reset([Reply(status=529, error_message="overloaded right now")])
    lease = await relay.open_lease("r", upstream_for(fake, native_dialects=frozenset({"anthropic"})))
    path, header, body = CASES["anthropic"]
    async with httpx.AsyncClient(timeout=30) as http:
        root = lease.base_url.removesuffix("/v1")
        answer = await http.post(root + path, json=body, headers=auth(header, lease.token))
    await lease.close()
    assert answer.status_code == 529 and answer.json()["error"]["message"] == "overloaded right now"
    [turn] = lease.turns()
    assert turn.upstream_status == 529 and turn.upstream_error == {"message": "overloaded right now",
                                                                   "type": "scripted"}


async def test_a_body_the_translation_refuses_still_goes_through(relay: Relay, fake: FakeLLMServer) -> None:
    """An image is refused for a chat upstream (text-only here) but is the native upstream's to judge."""
    fake.app.native = frozenset({"anthropic"})
    fake.app.reset([Reply(content="a cat")])
    path, header, body = CASES["anthropic"]
    image = {**body, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]}
    translated = await relay.open_lease("t", upstream_for(fake))
    native = await relay.open_lease("n", upstream_for(fake, native_dialects=frozenset({"anthropic"})))
    root = native.base_url.removesuffix("/v1")
    async with httpx.AsyncClient(timeout=30) as http:
        refused = await http.post(root + path, json=image, headers=auth(header, translated.token))
        passed = await http.post(root + path, json=image, headers=auth(header, native.token))
    for lease in (translated, native):
        await lease.close()
    assert refused.status_code == 400 and "image" in refused.json()["error"]["message"]
    assert passed.status_code == 200 and passed.json()["content"][0]["text"] == "a cat"
    assert [r.path for r in fake.app.requests] == ["/v1/messages"]
    [turn] = native.turns()
    assert turn.passthrough == "anthropic" and turn.request_messages == [] and turn.message.content == "a cat"


def test_the_endpoint_or_the_request_says_which_dialects_are_native() -> None:
    settings = Settings(llm_endpoints={"claude": LlmEndpoint(base_url="https://api.anthropic.com/v1",
                                                             api_key="sk-a", default_model="claude-x",
                                                             native_dialects=("anthropic",))})
    by_endpoint = resolve_upstream(RolloutRequest(instruction="x", endpoint="claude"), settings)
    assert by_endpoint.native_dialects == {"anthropic"}
    caller = {"instruction": "x", "base_url": "http://127.0.0.1:9/v1", "api_key": "k", "model": "m"}
    by_caller = resolve_upstream(RolloutRequest(**caller, native_dialects=["responses", "google"]), settings)
    assert by_caller.native_dialects == {"responses", "google"}
    assert resolve_upstream(RolloutRequest(**caller), settings).native_dialects == frozenset()
    with pytest.raises(ValueError, match="native_dialects"):
        RolloutRequest(**caller, native_dialects=["cohere"])
    anthropic = DIALECTS["anthropic"]
    route = anthropic.match("/v1/messages")
    assert route is not None
    native = anthropic.native(route, {}, {"model": "x", "max_tokens": 10}, by_endpoint, {})
    assert native.url == "https://api.anthropic.com/v1/messages" and native.body["model"] == "claude-x"
    assert native.headers["x-api-key"] == "sk-a" and "Authorization" not in native.headers


LAST_EVENT = {"anthropic": b"message_stop", "responses": b"response.completed", "google": b"finishReason"}


async def _hang_up(relay: Relay, fake: FakeLLMServer, dialect: str, reply: Reply, enough: bytes) -> Turn:
    """A streamed call in `dialect` passed through to the fake answering `reply`, the agent hanging up once it
    has read `enough`: the turn recorded."""
    fake.app.native = frozenset({dialect})
    fake.app.reset([reply])
    lease = await relay.open_lease("r", upstream_for(fake, native_dialects=frozenset({dialect})))
    path, header, body = CASES[dialect]
    spath, extra = stream_path(dialect, path)
    url = lease.base_url.removesuffix("/v1") + spath
    turn = await turn_after_hang_up(lease, url, {**body, **extra}, auth(header, lease.token), enough)
    await lease.close()
    return turn


@pytest.mark.parametrize("dialect", sorted(CASES))
async def test_an_agent_hanging_up_after_the_last_event_lost_nothing(
    dialect: str, relay: Relay, fake: FakeLLMServer
) -> None:
    """Codex closes the connection on `response.completed`: the turn is whole, not a disconnect. The upstream
    holds the stream open past its last event, so the relay is sure to see the agent gone."""
    turn = await _hang_up(relay, fake, dialect, Reply(content="all done", trailer_delay_s=0.5), LAST_EVENT[dialect])
    assert turn.error is None and turn.message.content == "all done"


@pytest.mark.parametrize("dialect", sorted(CASES))
async def test_an_agent_hanging_up_mid_answer_is_recorded(dialect: str, relay: Relay, fake: FakeLLMServer) -> None:
    turn = await _hang_up(relay, fake, dialect, Reply(content="one two three four five six", token_delay_s=0.2),
                          b"one")
    assert turn.error == "client disconnected"
    assert turn.message.content is not None and turn.message.content.startswith("one")
