"""Engine adapters (`llm.engines`) through the relay, over loopback HTTP, against fakes speaking each engine's wire
shapes (`tests/fakes/engines.py`: vLLM and SGLang as documented, they need a GPU; llama.cpp as seen on these
machines, also tested for real in test_llamacpp.py; a strict hosted API). An agent that streams with tools is
never broken by what the relay adds, and the turn carries the engine's own ids."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import aiohttp
import openai
import pytest
from pydantic import SecretStr

from coding_agent_env.llm import Relay, Upstream, engines, exchange
from coding_agent_env.llm.capture import TurnAssembler
from coding_agent_env.llm.sse import chunks_of
from coding_agent_env.models import Mode, Turn
from tests.fakes.engines import LlamaCppLLM, SglangLLM, StrictOpenAI, VllmLLM
from tests.fakes.llm import FakeLLM, FakeLLMServer, Reply
from tests.llm.conftest import SERVER_KEY

MESSAGES = [{"role": "user", "content": "list the files"}]
TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "run a command",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}}]
SCRIPT = [Reply(content="I will look", tool_calls=(("bash", '{"cmd": "ls -la"}'),)), Reply(content="done")]


@pytest.fixture(autouse=True)
def _fresh_detection() -> Iterator[None]:
    engines.forget()
    yield
    engines.forget()


def serve(app: FakeLLM) -> FakeLLMServer:
    app.api_key = SERVER_KEY
    app.script = list(SCRIPT)
    return FakeLLMServer(app)


def upstream(server: FakeLLMServer, engine: str | None = None, **kw: Any) -> Upstream:
    values: dict[str, Any] = {"mode": Mode.TRANSPARENT_PROXY, **kw}
    return Upstream(base_url=server.base_url, api_key=SecretStr(SERVER_KEY), model="m", engine=engine, **values)


def client(base_url: str, token: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url, api_key=token, max_retries=0, timeout=10)


async def streamed_tool_call(relay: Relay, up: Upstream) -> tuple[list[Any], Turn, Any]:
    lease = await relay.open_lease("r", up)
    async with client(lease.base_url, lease.token) as llm:
        stream = await llm.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS, stream=True,  # type: ignore[arg-type]
                                                   stream_options={"include_usage": True})
        chunks = [chunk async for chunk in stream]
    await lease.close()
    [turn] = lease.turns()
    return chunks, turn, lease


def assert_agent_got_the_tool_call(chunks: list[Any]) -> None:
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert text == "I will look"
    assert calls[0].function.name == "bash" and json.loads("".join(c.function.arguments or "" for c in calls)) == {
        "cmd": "ls -la"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5


def assert_engine_ids(turn: Turn, app: FakeLLM) -> None:
    assert turn.error is None and turn.upstream_status == 200
    call = '<tool_call>{"name": "bash", "arguments": {"cmd": "ls -la"}}</tool_call>'
    sampled = ["I ", "will ", "look", call, "<|end|>"]
    assert turn.completion_token_ids == [app.vocab[p] for p in sampled]
    assert turn.per_token_logps == [-0.125 * (i + 1) for i in range(5)]
    prompt = ["<|user|>", "list ", "the ", "files", "<|end|>", "<|assistant|>"]
    assert turn.prompt_token_ids == [app.vocab[p] for p in prompt]


async def test_vllm_fake_streamed_tools_ids_in_its_fields_and_detected(relay: Relay) -> None:
    with serve(VllmLLM()) as server:
        chunks, turn, _ = await streamed_tool_call(relay, upstream(server, token_ids=True))
        assert_agent_got_the_tool_call(chunks)
        assert_engine_ids(turn, server.app)
        [seen] = server.app.requests
        assert seen.body is not None and seen.body["stream"] is True and seen.body["return_token_ids"] is True
        assert engines.engine_for(server.base_url, None).name == "vllm"  # learnt from its `stop_reason`
        assert engines.engine_for(server.base_url, None) is engines.GENERIC  # asks ids only where the endpoint says


async def test_sglang_configured_streamed_call_goes_whole_and_is_streamed_to_the_agent(relay: Relay) -> None:
    with serve(SglangLLM()) as server:
        chunks, turn, _ = await streamed_tool_call(relay, upstream(server, "sglang"))
        assert_agent_got_the_tool_call(chunks)
        assert_engine_ids(turn, server.app)
        [seen] = server.app.requests
        assert seen.body is not None and seen.body["stream"] is False and "stream_options" not in seen.body
        assert seen.body["return_prompt_token_ids"] is True and seen.body["return_meta_info"] is True
        assert "return_token_ids" not in seen.body
        assert turn.stream is True  # the agent's view


async def test_sglang_unconfigured_is_detected_from_a_refusal_and_the_call_rerouted(relay: Relay) -> None:
    with serve(SglangLLM()) as server:
        # vLLM's switch is ignored by SGLang: the first whole call has no ids, but says the engine (`matched_stop`)
        lease = await relay.open_lease("r", upstream(server, token_ids=True))
        async with client(lease.base_url, lease.token) as llm:
            await llm.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
            await llm.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        first, second = lease.turns()
        assert first.prompt_token_ids is None and second.prompt_token_ids
        assert engines.engine_for(server.base_url, None).name == "sglang"


async def test_llamacpp_refusal_of_logprobs_with_tools_and_stream_is_rerouted(relay: Relay) -> None:
    with serve(LlamaCppLLM()) as server:
        chunks, turn, _ = await streamed_tool_call(relay, upstream(server, token_ids=True))
        assert_agent_got_the_tool_call(chunks)
        assert_engine_ids(turn, server.app)
        refused, sent, template, tokenize = server.app.requests
        assert refused.body is not None and refused.body["stream"] is True
        assert sent.body is not None and sent.body["stream"] is False and sent.body["logprobs"] is True
        assert "return_token_ids" not in sent.body
        assert template.path == "/apply-template" and template.body is not None
        assert template.body["messages"] == MESSAGES and template.body["tools"] == TOOLS
        assert tokenize.path == "/tokenize" and template.headers["authorization"] == f"Bearer {SERVER_KEY}"
        assert engines.engine_for(server.base_url, None).name == "llamacpp"
        # Known from now on: the next call goes whole at once.
        await streamed_tool_call(relay, upstream(server))
        assert [r.body["stream"] for r in server.app.requests if r.path.endswith("completions")][2:] == [False]


async def test_llamacpp_keepalives_while_the_engine_works(relay: Relay, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exchange, "KEEPALIVE_S", 0.05)
    app = LlamaCppLLM(whole_delay_s=0.4)
    with serve(app) as server:
        lease = await relay.open_lease("r", upstream(server, "llamacpp"))
        async with aiohttp.ClientSession() as http:
            body = {"model": "m", "messages": MESSAGES, "tools": TOOLS, "stream": True}
            async with http.post(lease.base_url + "/chat/completions", json=body,
                                 headers={"Authorization": f"Bearer {lease.token}"}) as response:
                assert response.status == 200 and response.content_type == "text/event-stream"
                raw = await response.read()
        await lease.close()
    assert raw.startswith(b": keep-alive\n\n") and raw.count(b": keep-alive") >= 3
    assert raw.endswith(b"data: [DONE]\n\n")
    [turn] = lease.turns()
    assert turn.error is None and turn.completion_token_ids and turn.prompt_token_ids


async def test_llamacpp_refusal_after_keepalives_is_an_in_band_error(
    relay: Relay, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(exchange, "KEEPALIVE_S", 0.05)
    app = LlamaCppLLM(whole_delay_s=0.3)
    with serve(app) as server:
        app.script = [Reply(status=500, error_message="engine crashed")]
        lease = await relay.open_lease("r", upstream(server, "llamacpp"))
        async with client(lease.base_url, lease.token) as llm:
            stream = await llm.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS, stream=True)  # type: ignore[arg-type]
            with pytest.raises(openai.APIError, match="engine crashed"):
                [chunk async for chunk in stream]
        await lease.close()
    [turn] = lease.turns()
    assert turn.upstream_status == 500 and "engine crashed" in (turn.error or "")


async def test_anthropic_agent_streaming_tools_against_llamacpp_gets_its_dialect(relay: Relay) -> None:
    with serve(LlamaCppLLM()) as server:
        lease = await relay.open_lease("r", upstream(server, "llamacpp"))
        body = {"model": "m", "max_tokens": 100, "stream": True, "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"name": "bash", "description": "run", "input_schema": {"type": "object"}}]}
        async with aiohttp.ClientSession() as http:
            async with http.post(lease.base_url.removesuffix("/v1") + "/v1/messages", json=body,
                                 headers={"x-api-key": lease.token, "anthropic-version": "2023-06-01"}) as response:
                assert response.status == 200
                raw = (await response.read()).decode()
        await lease.close()
    assert "event: message_start" in raw and "event: message_stop" in raw and '"tool_use"' in raw
    [turn] = lease.turns()
    assert turn.error is None and turn.completion_token_ids and turn.prompt_token_ids


async def test_strict_api_refusing_an_added_field_is_called_again_without_it(relay: Relay) -> None:
    with serve(StrictOpenAI()) as server:
        chunks, turn, _ = await streamed_tool_call(relay, upstream(server, token_ids=True))
        assert_agent_got_the_tool_call(chunks)
        assert turn.error is None and turn.per_token_logps and not turn.completion_token_ids
        refused, sent = server.app.requests
        assert refused.body is not None and "return_token_ids" in refused.body
        assert sent.body is not None and "return_token_ids" not in sent.body and sent.body["stream"] is True
        await streamed_tool_call(relay, upstream(server, token_ids=True))  # remembered: asked right at once
        assert len(server.app.requests) == 3 and "return_token_ids" not in (server.app.requests[2].body or {})


async def test_a_refusal_not_caused_by_the_relay_reaches_the_agent_unchanged(relay: Relay) -> None:
    with serve(LlamaCppLLM()) as server:
        server.app.script = [Reply(status=400, error_message="the prompt is too long")]
        lease = await relay.open_lease("r", upstream(server, "llamacpp"))
        async with client(lease.base_url, lease.token) as llm:
            with pytest.raises(openai.BadRequestError, match="too long"):
                await llm.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        await lease.close()
        assert len(server.app.requests) == 1


async def test_black_box_adds_nothing_and_detects_nothing(relay: Relay) -> None:
    with serve(LlamaCppLLM()) as server:
        chunks, turn, _ = await streamed_tool_call(relay, upstream(server, mode=Mode.BLACK_BOX))
        assert_agent_got_the_tool_call(chunks)
        [seen] = server.app.requests
        assert seen.body is not None and "logprobs" not in seen.body and seen.body["stream"] is True
        assert engines.engine_for(server.base_url, None) is engines.GENERIC


def test_chunks_of_a_whole_answer_assemble_to_the_same_turn() -> None:
    whole = {"id": "x", "model": "m", "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "hi", "reasoning_content": "think",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}
    a, b = TurnAssembler(), TurnAssembler()
    a.add_response(whole)
    for chunk in chunks_of(whole):
        b.add_chunk(chunk)
    assert a.message() == b.message() and a.finish_reason == b.finish_reason and a.usage == b.usage


def test_each_engine_reads_its_own_ids() -> None:
    llama = engines.ENGINES["llamacpp"].ids({}, {"logprobs": {"content": [{"id": 5, "logprob": -1.0}]}})
    sglang = engines.ENGINES["sglang"].ids({}, {"prompt_token_ids": [1, 2], "meta_info": {
        "output_token_logprobs": [[-0.5, 7, "a"], {"token_id": 8, "logprob": -0.1}]}})
    vllm = engines.ENGINES["vllm"].ids({"prompt_token_ids": [1]}, {"token_ids": [3]})
    none = engines.ENGINES["openai"].ids({"prompt_token_ids": [1]}, {"token_ids": [3]})
    assert (llama.prompt, llama.completion) == (None, [5])
    assert (sglang.prompt, sglang.completion) == ([1, 2], [7, 8])
    assert (vllm.prompt, vllm.completion) == ([1], [3])
    assert (none.prompt, none.completion) == (None, None)
