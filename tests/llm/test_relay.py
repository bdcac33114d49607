"""The relay over real loopback HTTP (and its unix socket) against the scripted fake LLM."""

from __future__ import annotations

import json
import socket
from typing import Any

import aiohttp
import openai
import pytest

from coding_agent_env.errors import RelayError
from coding_agent_env.llm import Relay
from coding_agent_env.models import Mode, Turn
from tests.fakes.llm import FakeLLMServer, Reply
from tests.helpers import poll
from tests.llm.conftest import SERVER_KEY, turn_after_hang_up, upstream_for

MESSAGES = [{"role": "user", "content": "list the files"}]


def client(base_url: str, token: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url, api_key=token, max_retries=0, timeout=10)


async def test_forwards_with_server_key_while_agent_sends_only_its_token(relay: Relay, fake: FakeLLMServer) -> None:
    fake.app.script = [Reply(content="I will look", tool_calls=(("bash", '{"cmd": "ls -la"}'),))]
    lease = await relay.open_lease("r1", upstream_for(fake))
    async with client(lease.base_url, lease.token) as llm:
        stream = await llm.chat.completions.create(model="anything", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
        chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "I will look"
    seen = fake.app.requests[-1]
    assert seen.headers["authorization"] == f"Bearer {SERVER_KEY}"
    assert lease.token not in json.dumps(seen.headers)
    [turn] = lease.turns()
    assert turn.message.tool_calls[0].name == "bash"
    assert json.loads(turn.message.tool_calls[0].arguments) == {"cmd": "ls -la"}
    assert turn.finish_reason == "tool_calls"
    # 3 words, 1 tool call, the end marker
    assert turn.usage is not None and turn.usage.total_tokens == turn.usage.prompt_tokens + 5
    assert turn.upstream_status == 200 and turn.error is None
    assert turn.model == "Qwen/Qwen3-4B" and seen.body is not None and seen.body["model"] == "Qwen/Qwen3-4B"
    await lease.close()


@pytest.mark.parametrize("token", [None, "", "car-wrong", "Basic abc"])
async def test_wrong_or_missing_token_gets_401_on_every_route(relay: Relay, fake: FakeLLMServer, token: str | None) -> None:
    await relay.open_lease("r1", upstream_for(fake))
    headers = {} if token is None else {"Authorization": token if token.startswith("Basic") else f"Bearer {token}"}
    async with aiohttp.ClientSession() as http:
        for method, path in [("POST", "/chat/completions"), ("GET", "/models"), ("GET", "/nope"), ("POST", "/exit")]:
            async with http.request(method, relay.base_url + path, headers=headers, json={"messages": MESSAGES}) as r:
                assert r.status == 401, (method, path)
    assert fake.app.requests == []


async def test_revoked_and_expired_tokens_get_401(relay: Relay, fake: FakeLLMServer) -> None:
    lease = await relay.open_lease("r1", upstream_for(fake))
    expired = await relay.open_lease("r2", upstream_for(fake), ttl_s=0.0)
    async with client(lease.base_url, lease.token) as llm:
        await llm.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        await lease.close()
        with pytest.raises(openai.AuthenticationError):
            await llm.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    async with client(expired.base_url, expired.token) as llm:
        with pytest.raises(openai.AuthenticationError):
            await llm.models.list()
    assert len(fake.app.requests) == 1 and len(lease.turns()) == 1


async def test_one_rollouts_token_reaches_only_its_own_turns(relay: Relay, fake: FakeLLMServer) -> None:
    a = await relay.open_lease("a", upstream_for(fake))
    b = await relay.open_lease("b", upstream_for(fake, model="other/model"))
    assert a.token != b.token
    async with client(a.base_url, a.token) as llm:
        await llm.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        models = await llm.models.list()
    assert [m.id for m in models.data] == ["Qwen/Qwen3-4B"]
    assert len(a.turns()) == 1 and b.turns() == []


async def test_streamed_and_whole_calls_record_the_same_turn(relay: Relay, fake: FakeLLMServer) -> None:
    fake.app.script = [Reply(content="a b c", reasoning="think", tool_calls=(("edit", '{"path": "x"}'), ("bash", "{}")))]
    turns: list[Turn] = []
    for stream in (True, False):
        lease = await relay.open_lease(f"s{stream}", upstream_for(fake, mode=Mode.TRANSPARENT_PROXY, top_logprobs=2))
        async with client(lease.base_url, lease.token) as llm:
            response = await llm.chat.completions.create(model="m", messages=MESSAGES, stream=stream)  # type: ignore[call-overload]
            if stream:
                _ = [c async for c in response]
        turns.extend(lease.turns())
    dumps = [t.model_dump(exclude={"latency_s", "stream", "timestamp"}) for t in turns]
    for dump in dumps:  # each reply's tool-call ids are its own, as an engine's are
        dump["message"]["tool_calls"] = [{**call, "id": None} for call in dump["message"]["tool_calls"]]
    assert dumps[0] == dumps[1]
    assert turns[0].message.reasoning_content == "think" and len(turns[0].message.tool_calls) == 2


async def test_a_whole_answer_longer_than_one_network_read_arrives_whole(relay: Relay, fake: FakeLLMServer) -> None:
    """A non-streamed answer of a few hundred KB reaches the relay in many reads: all of them are kept."""
    long = "word " * 60_000
    fake.app.script = [Reply(content=long)]
    lease = await relay.open_lease("long", upstream_for(fake))
    async with client(lease.base_url, lease.token) as llm:
        answer = await llm.chat.completions.create(model="m", messages=MESSAGES)
    assert answer.choices[0].message.content == long
    [turn] = lease.turns()
    assert turn.error is None and turn.message.content == long


async def test_transparent_proxy_asks_for_and_records_token_ids_and_logprobs(relay: Relay, fake: FakeLLMServer) -> None:
    fake.app.script = [Reply(content="one two three")]
    lease = await relay.open_lease("r", upstream_for(fake, mode=Mode.TRANSPARENT_PROXY, top_logprobs=3, token_ids=True))
    async with client(lease.base_url, lease.token) as llm:
        stream = await llm.chat.completions.create(model="m", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
        _ = [c async for c in stream]
    body = fake.app.requests[-1].body
    assert body is not None
    assert (body["logprobs"], body["top_logprobs"], body["return_token_ids"]) == (True, 3, True)
    [turn] = lease.turns()
    vocab = fake.app.vocab
    assert turn.completion_token_ids == [vocab[p] for p in ("one ", "two ", "three", "<|end|>")]
    assert turn.prompt_token_ids == [vocab[p] for p in ("<|user|>", "list ", "the ", "files", "<|end|>", "<|assistant|>")]
    assert turn.per_token_logps == [-0.125, -0.25, -0.375, -0.5]
    assert turn.completion_tokens == ["one ", "two ", "three", "<|end|>"]


async def test_black_box_does_not_ask_for_logprobs(relay: Relay, fake: FakeLLMServer) -> None:
    lease = await relay.open_lease("r", upstream_for(fake))
    async with client(lease.base_url, lease.token) as llm:
        await llm.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    body = fake.app.requests[-1].body
    assert body is not None and "logprobs" not in body and "return_token_ids" not in body
    assert lease.turns()[0].completion_token_ids == []


async def test_caps_thinking_and_namespaced_model(relay: Relay, fake: FakeLLMServer) -> None:
    lease = await relay.open_lease("r", upstream_for(fake, model="Qwen/Qwen3-4B", max_tokens_cap=64, disable_thinking=True))
    async with client(lease.base_url, lease.token) as llm:
        await llm.chat.completions.create(model="x", messages=MESSAGES, max_tokens=5000)  # type: ignore[arg-type]
        await llm.chat.completions.create(model="x", messages=MESSAGES, max_tokens=10)  # type: ignore[arg-type]
        await llm.chat.completions.create(model="x", messages=MESSAGES)  # type: ignore[arg-type]
    bodies = [r.body for r in fake.app.requests]
    assert [b["max_tokens"] for b in bodies if b] == [64, 10, 64]
    assert all(b and b["model"] == "Qwen/Qwen3-4B" for b in bodies)
    assert all(b and b["chat_template_kwargs"] == {"enable_thinking": False} for b in bodies)


async def test_unpinned_model_passes_through_intact(relay: Relay, fake: FakeLLMServer) -> None:
    lease = await relay.open_lease("r", upstream_for(fake, model=None))
    async with client(lease.base_url, lease.token) as llm:
        await llm.chat.completions.create(model="org/Model-7B:v1", messages=MESSAGES)  # type: ignore[arg-type]
    assert fake.app.requests[-1].body["model"] == "org/Model-7B:v1"  # type: ignore[index]


@pytest.mark.parametrize("status", [400, 429, 500, 503])
async def test_upstream_errors_are_recorded_and_passed_back_without_the_key(
    relay: Relay, fake: FakeLLMServer, status: int
) -> None:
    fake.app.script = [Reply(status=status, error_message=f"bad key {SERVER_KEY} for you"), Reply(content="fine")]
    lease = await relay.open_lease("r", upstream_for(fake))
    async with client(lease.base_url, lease.token) as llm:
        with pytest.raises(openai.APIStatusError) as caught:
            await llm.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        assert caught.value.status_code == status
        assert SERVER_KEY not in str(caught.value.body) and SERVER_KEY not in caught.value.response.text
        await llm.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    first, second = lease.turns()
    assert first.upstream_status == status and first.error is not None and "[REDACTED]" in first.error
    assert second.error is None and second.message.content == "fine"
    assert SERVER_KEY not in json.dumps([t.model_dump(mode="json") for t in lease.turns()])


async def test_upstream_timeout_and_unreachable_are_recorded(fake: FakeLLMServer, tmp_path: object) -> None:
    from coding_agent_env.settings import Settings

    settings = Settings(state_dir=tmp_path / "s", relay_read_timeout_s=0.3)  # type: ignore[operator]
    fake.app.script = [Reply(hang=True)]
    async with Relay(settings) as relay:
        lease = await relay.open_lease("r", upstream_for(fake))
        dead = await relay.open_lease("d", upstream_for(fake, base_url="http://127.0.0.1:9/v1"))
        async with client(lease.base_url, lease.token) as llm:
            with pytest.raises(openai.APIStatusError) as caught:
                await llm.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        assert caught.value.status_code == 504
        async with client(dead.base_url, dead.token) as llm:
            with pytest.raises(openai.APIStatusError) as caught:
                await llm.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        assert caught.value.status_code == 502
        assert lease.turns()[0].error == "upstream timed out"
        assert dead.turns()[0].error is not None and "unreachable" in dead.turns()[0].error


async def test_upstream_disconnect_mid_stream_is_recorded(relay: Relay, fake: FakeLLMServer) -> None:
    fake.app.script = [Reply(content="a b c d", drop_after_chunks=2), Reply(content="again")]
    lease = await relay.open_lease("r", upstream_for(fake))
    async with client(lease.base_url, lease.token) as llm:
        with pytest.raises(openai.APIError):
            stream = await llm.chat.completions.create(model="m", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
            _ = [c async for c in stream]
        ok = await llm.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert ok.choices[0].message.content == "again"
    broken = lease.turns()[0]
    assert broken.error is not None and broken.message.content == "a "


def relay_root(lease: Any) -> str:
    return str(lease.base_url).removesuffix("/v1")


def bearer(lease: Any) -> dict[str, str]:
    return {"Authorization": f"Bearer {lease.token}"}


# (path, streamed body, what ends the answer) for chat completions and a dialect the relay translates
HANG_UPS = {
    "chat": ("/v1/chat/completions", {"messages": MESSAGES, "stream": True}, b"[DONE]"),
    "responses": ("/v1/responses", {"input": "hi", "stream": True}, b"response.completed"),
}


@pytest.mark.parametrize("api", sorted(HANG_UPS))
async def test_a_client_hanging_up_on_the_last_event_lost_nothing(relay: Relay, fake: FakeLLMServer, api: str) -> None:
    """Codex hangs up on `response.completed`. The upstream holds its stream open past [DONE], so the relay is
    sure to see the client gone while it still has the stream."""
    fake.app.script = [Reply(content="all done", trailer_delay_s=0.5)]
    lease = await relay.open_lease("r", upstream_for(fake))
    path, body, last = HANG_UPS[api]
    turn = await turn_after_hang_up(lease, relay_root(lease) + path, body, bearer(lease), last)
    await lease.close()
    assert turn.error is None and turn.message.content == "all done"


@pytest.mark.parametrize("api", sorted(HANG_UPS))
async def test_a_client_hanging_up_mid_answer_is_recorded(relay: Relay, fake: FakeLLMServer, api: str) -> None:
    fake.app.script = [Reply(content="one two three four five six", token_delay_s=0.2)]
    lease = await relay.open_lease("r", upstream_for(fake))
    path, body, _ = HANG_UPS[api]
    turn = await turn_after_hang_up(lease, relay_root(lease) + path, body, bearer(lease), b"one")
    await lease.close()
    assert turn.error == "client disconnected"
    assert turn.message.content is not None and turn.message.content.startswith("one")


async def test_unix_socket_serves_the_same_api(relay: Relay, fake: FakeLLMServer) -> None:
    lease = await relay.open_lease("r", upstream_for(fake))
    connector = aiohttp.UnixConnector(path=str(lease.socket_path))
    async with aiohttp.ClientSession(connector=connector) as http:
        headers = {"Authorization": f"Bearer {lease.token}"}
        async with http.post("http://relay/v1/chat/completions", json={"messages": MESSAGES}, headers=headers) as r:
            assert r.status == 200
            assert (await r.json())["choices"][0]["message"]["content"] == "ok"
        async with http.get("http://relay/v1/models") as r:
            assert r.status == 401
    assert len(lease.turns()) == 1
    assert lease.socket_path.stat().st_mode & 0o777 == 0o666


async def test_body_limits_and_hostile_json(fake: FakeLLMServer, tmp_path: object) -> None:
    from coding_agent_env.settings import Settings

    settings = Settings(state_dir=tmp_path / "s", relay_max_body_bytes=100_000)  # type: ignore[operator]
    async with Relay(settings) as relay:
        lease = await relay.open_lease("r", upstream_for(fake))
        headers = {"Authorization": f"Bearer {lease.token}", "Content-Type": "application/json"}
        async with aiohttp.ClientSession() as http:
            url = lease.base_url + "/chat/completions"
            async with http.post(url, data=b"x" * 200_000, headers=headers) as r:
                assert r.status == 413
            async with http.post(url, data=b"[" * 50_000 + b"]" * 50_000, headers=headers) as r:
                assert r.status == 400
            async with http.post(url, data=b"not json", headers=headers) as r:
                assert r.status == 400
    assert fake.app.requests == []


async def test_prompt_is_recorded_incrementally(relay: Relay, fake: FakeLLMServer) -> None:
    lease = await relay.open_lease("r", upstream_for(fake))
    history = list(MESSAGES)
    async with client(lease.base_url, lease.token) as llm:
        for step in range(4):
            reply = await llm.chat.completions.create(model="m", messages=history)  # type: ignore[arg-type]
            history += [{"role": "assistant", "content": reply.choices[0].message.content},
                        {"role": "user", "content": f"step {step}"}]
    turns = lease.turns()
    assert [t.request_messages_reused for t in turns] == [0, 1, 3, 5]
    assert all(len(t.request_messages) == (1 if t.turn == 0 else 2) for t in turns)
    rebuilt: list[dict[str, object]] = []
    for t in turns:
        rebuilt = rebuilt[: t.request_messages_reused] + t.request_messages
    assert rebuilt == history[:-2]


async def test_close_cancels_calls_in_flight_and_records_them(relay: Relay, fake: FakeLLMServer) -> None:
    import asyncio

    fake.app.script = [Reply(hang=True)]
    lease = await relay.open_lease("r", upstream_for(fake))
    async with client(lease.base_url, lease.token) as llm:
        call = asyncio.ensure_future(llm.chat.completions.create(model="m", messages=MESSAGES))  # type: ignore[arg-type]
        await poll(lambda: lease.calls_started > 0, "the call to reach the relay", timeout_s=5)
        await lease.close()
        with pytest.raises(openai.APIError):
            await call
    [turn] = lease.turns()
    assert turn.error == "lease closed"


async def test_serves_a_listening_socket_made_elsewhere_until_stopped(relay: Relay, fake: FakeLLMServer) -> None:
    """`serve_listener` (what the local backend uses in an agent's own network namespace): the same routes
    and token check on the given socket; `stop` closes it and is idempotent, also after the relay stopped."""
    fake.app.script = [Reply(content="served")]
    lease = await relay.open_lease("r1", upstream_for(fake))
    assert lease.serve is not None
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    stop = await lease.serve(sock)
    async with client(url, lease.token) as llm:
        answer = await llm.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert answer.choices[0].message.content == "served" and len(lease.turns()) == 1
    async with aiohttp.ClientSession() as http, http.get(url + "/models") as r:
        assert r.status == 401
    await stop()
    assert sock.fileno() == -1
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", int(url.split(":")[2].split("/")[0])), 2).close()
    await stop()
    other = socket.socket()
    other.bind(("127.0.0.1", 0))
    other.listen()
    stop_other = await relay.serve_listener(other)
    await relay.stop()
    await stop_other()
    assert other.fileno() == -1


async def test_serving_on_a_stopped_relay_is_refused_and_closes_the_socket(relay: Relay) -> None:
    await relay.stop()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    with pytest.raises(RelayError, match="not running"):
        await relay.serve_listener(sock)
    assert sock.fileno() == -1
