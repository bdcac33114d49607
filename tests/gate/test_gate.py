"""The gate over real loopback HTTP: round trips, streams, isolation, tokens, unregister, threads."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import openai
import pytest

from coding_agent_env.errors import GateTimeoutError, InvalidResponseError, RolloutClosedError, UnknownRequestError
from coding_agent_env.gate import Gate, GateRequest
from coding_agent_env.llm import Relay, Upstream
from coding_agent_env.models import Mode
from coding_agent_env.settings import Settings

MESSAGES = [{"role": "user", "content": "hi"}]
TOOL_ANSWER = {
    "choices": [{"message": {"role": "assistant", "content": "running", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}]},
        "finish_reason": "tool_calls", "token_ids": [7, 8, 9],
        "logprobs": {"content": [{"token": "running", "logprob": -0.5, "top_logprobs": []}]}}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6},
    "prompt_token_ids": [1, 2, 3],
}


@pytest.fixture
async def gate() -> AsyncIterator[Gate]:
    async with Gate(Settings(gate_max_body_bytes=100_000)) as gate:
        yield gate


def agent(base_url: str, token: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url, api_key=token, max_retries=0, timeout=10)


async def answer_next(gate: Gate, rollout_id: str, response: object = TOOL_ANSWER) -> GateRequest:
    request = await gate.next_request(rollout_id, timeout=5)
    await gate.deliver(request, response)
    return request


@pytest.mark.parametrize("stream", [False, True])
async def test_round_trip_parsed_by_the_openai_client(gate: Gate, stream: bool) -> None:
    rollout = await gate.register()
    assert rollout.base_url.startswith("http://127.0.0.1:")
    trainer = asyncio.ensure_future(answer_next(gate, rollout.rollout_id))
    async with agent(rollout.base_url, rollout.token) as llm:
        kwargs = {"stream_options": {"include_usage": True}} if stream else {}
        response = await llm.chat.completions.create(model="Qwen/Qwen3-4B", messages=MESSAGES, stream=stream, **kwargs)  # type: ignore[call-overload]
        if stream:
            chunks = [c async for c in response]
            content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
            finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
            assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 6
            assert (calls[0].function.name, calls[0].function.arguments) == ("bash", '{"cmd": "ls"}')
        else:
            content, finish = response.choices[0].message.content, [response.choices[0].finish_reason]
            assert response.choices[0].message.tool_calls[0].function.name == "bash"
    request = await trainer
    assert request.body["model"] == "Qwen/Qwen3-4B" and request.stream is stream and request.messages == MESSAGES
    assert content == "running" and finish == ["tool_calls"]


async def test_trainer_in_another_thread_and_loop(gate: Gate) -> None:
    rollouts = [await gate.register() for _ in range(3)]
    seen: dict[str, str] = {}

    def trainer() -> None:
        async def run() -> None:
            for r in rollouts:
                request = await gate.next_request(r.rollout_id, timeout=5)
                seen[r.rollout_id] = request.messages[0]["content"]
                await gate.deliver(request, {"choices": [{"message": {"role": "assistant", "content": f"to {r.rollout_id}"}}]})
        asyncio.run(run())

    thread = threading.Thread(target=trainer)
    thread.start()
    try:
        async def call(r: object) -> str:
            async with agent(r.base_url, r.token) as llm:  # type: ignore[attr-defined]
                reply = await llm.chat.completions.create(model="m", messages=[{"role": "user", "content": r.rollout_id}])  # type: ignore[attr-defined]
                return reply.choices[0].message.content or ""
        replies = await asyncio.gather(*(call(r) for r in rollouts))
    finally:
        await asyncio.to_thread(thread.join, 10)
    assert replies == [f"to {r.rollout_id}" for r in rollouts]
    assert seen == {r.rollout_id: r.rollout_id for r in rollouts}


async def test_unregister_unblocks_waiting_calls_and_waiters(gate: Gate) -> None:
    rollout = await gate.register()
    other = await gate.register()
    waiter = asyncio.ensure_future(gate.next_request(other.rollout_id))
    async with agent(rollout.base_url, rollout.token) as llm:
        call = asyncio.ensure_future(llm.chat.completions.create(model="m", messages=MESSAGES))  # type: ignore[arg-type]
        request = await gate.next_request(rollout.rollout_id, timeout=5)
        await gate.unregister(rollout.rollout_id)
        await gate.unregister(other.rollout_id)
        with pytest.raises(openai.APIStatusError) as caught:
            await call
        assert caught.value.status_code == 410 and "unregistered" in caught.value.message
        with pytest.raises(openai.AuthenticationError):
            await llm.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    with pytest.raises(RolloutClosedError):
        await waiter
    with pytest.raises(UnknownRequestError):
        await gate.deliver(request, TOOL_ANSWER)


async def test_every_route_refuses_missing_or_foreign_tokens(gate: Gate) -> None:
    await gate.register()
    async with Gate() as elsewhere:
        foreign = await elsewhere.register()
    async with aiohttp.ClientSession() as http:
        for headers in ({}, {"Authorization": f"Bearer {foreign.token}"}, {"Authorization": "Bearer "}):
            for method, path in [("POST", "/chat/completions"), ("GET", "/models"), ("POST", "/exit"), ("GET", "/x")]:
                async with http.request(method, gate.base_url + path, headers=headers, json={}) as r:
                    assert r.status == 401, (headers, method, path)


async def test_exit_ends_the_trainers_loop(gate: Gate) -> None:
    rollout = await gate.register()
    collected: list[GateRequest] = []

    async def trainer() -> None:
        async for request in gate.requests(rollout.rollout_id):
            collected.append(request)
            await gate.deliver(request, {"choices": [{"message": {"content": "ok"}}]})

    loop_task = asyncio.ensure_future(trainer())
    async with agent(rollout.base_url, rollout.token) as llm:
        await llm.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    async with aiohttp.ClientSession() as http:
        async with http.post(gate.base_url + "/exit", headers={"Authorization": f"Bearer {rollout.token}"}) as r:
            assert r.status == 200
    async with asyncio.timeout(5):
        await loop_task
    assert len(collected) == 1


async def test_timeouts_bad_answers_and_body_limit(gate: Gate) -> None:
    rollout = await gate.register()
    with pytest.raises(GateTimeoutError):
        await gate.next_request(rollout.rollout_id, timeout=0.05)
    async with agent(rollout.base_url, rollout.token) as llm:
        call = asyncio.ensure_future(llm.chat.completions.create(model="m", messages=MESSAGES))  # type: ignore[arg-type]
        request = await gate.next_request(rollout.rollout_id, timeout=5)
        for bad in ({"choices": []}, "text", {"choices": [{"message": "x"}]}):
            with pytest.raises(InvalidResponseError):
                await gate.deliver(request, bad)
        await gate.deliver(request, {"choices": [{"message": {"content": "fine"}}]})
        assert (await call).choices[0].message.content == "fine"
    async with aiohttp.ClientSession() as http:
        headers = {"Authorization": f"Bearer {rollout.token}"}
        async with http.post(gate.base_url + "/chat/completions", data=b"x" * 200_000, headers=headers) as r:
            assert r.status == 413
        async with http.post(gate.base_url + "/chat/completions", data=b"[" * 90_000, headers=headers) as r:
            assert r.status == 400


async def test_relay_in_front_of_the_gate_records_the_trainers_tokens(gate: Gate, tmp_path: Path) -> None:
    """The full trainer path: agent -> relay (its own token) -> gate (the gate token as upstream key)."""
    rollout = await gate.register()
    async with Relay(Settings(state_dir=tmp_path / "state")) as relay:
        upstream = Upstream(base_url=rollout.base_url, api_key=rollout.token, model="Qwen/Qwen3-4B",  # type: ignore[arg-type]
                            mode=Mode.TRANSPARENT_PROXY, token_ids=True)
        lease = await relay.open_lease("r", upstream)
        for stream in (True, False):
            trainer = asyncio.ensure_future(answer_next(gate, rollout.rollout_id))
            async with agent(lease.base_url, lease.token) as llm:
                response = await llm.chat.completions.create(model="m", messages=MESSAGES, stream=stream)  # type: ignore[call-overload]
                if stream:
                    _ = [c async for c in response]
            request = await trainer
            assert request.body["return_token_ids"] is True and request.body["logprobs"] is True
        turns = lease.turns()
        await lease.close()
    assert [t.completion_token_ids for t in turns] == [[7, 8, 9]] * 2
    assert [t.prompt_token_ids for t in turns] == [[1, 2, 3]] * 2
    assert [t.per_token_logps for t in turns] == [[-0.5]] * 2
    same = {"latency_s", "stream", "turn", "timestamp", "request_messages_reused", "request_messages"}
    assert turns[0].model_dump(exclude=same) == \
        turns[1].model_dump(exclude=same)
