"""The relay's public route (`/llm/v1/...` on the server's port, for remote sandboxes), driven in-process through
its ASGI app against a real relay and the scripted fake LLM: only live per-rollout tokens get through."""

from __future__ import annotations

import asyncio
import json

import httpx

from coding_agent_env.api.relay_route import PublicRelayRoute
from coding_agent_env.llm import SharedRelay
from coding_agent_env.models import Mode
from coding_agent_env.settings import Settings
from tests.fakes.llm import FakeLLMServer, Reply
from tests.helpers import poll
from tests.llm.conftest import SERVER_KEY, upstream_for

CHAT = "/llm/v1/chat/completions"
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def test_bad_tokens_never_reach_the_relay_or_the_upstream(settings: Settings, fake: FakeLLMServer) -> None:
    shared = SharedRelay(settings)
    route = PublicRelayRoute(shared, settings)
    relay = await shared.get()
    try:
        lease = await relay.open_lease("r", upstream_for(fake))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=route), base_url="http://server") as http:
            async def bad(i: int) -> int:
                headers = {"authorization": f"Bearer cae-{i}"} if i % 3 else {}
                return (await http.post(CHAT, json=BODY, headers=headers)).status_code

            statuses = await asyncio.gather(*(bad(i) for i in range(1000)))
            assert set(statuses) == {401} and fake.app.requests == [] and lease.turns() == []
            good = await http.post(CHAT, json=BODY, headers={"authorization": f"Bearer {lease.token}"})
            assert good.status_code == 200 and good.json()["choices"][0]["message"]["content"] == "ok"
            assert len(fake.app.requests) == 1 and len(lease.turns()) == 1
            # Every dialect the relay speaks, with the token as each client sends it.
            google = await http.post("/llm/v1beta/models/m:generateContent?alt=json",
                                     headers={"x-goog-api-key": lease.token},
                                     json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]})
            assert google.status_code == 200 and google.json()["candidates"][0]["content"]["parts"] == [{"text": "ok"}]
            messages = await http.post("/llm/v1/messages", headers={"x-api-key": lease.token}, json={
                "model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}]})
            assert messages.status_code == 200 and messages.json()["content"] == [{"type": "text", "text": "ok"}]
            assert len(fake.app.requests) == 3 and len(lease.turns()) == 3
            await lease.close()
            revoked = await http.post(CHAT, json=BODY, headers={"authorization": f"Bearer {lease.token}"})
            assert revoked.status_code == 401 and len(fake.app.requests) == 3
    finally:
        await route.aclose()
        await shared.stop()


async def test_a_token_drives_only_its_own_rollout_and_streams_pass_through(
    settings: Settings, fake: FakeLLMServer
) -> None:
    shared = SharedRelay(settings.model_copy(update={"relay_max_body_bytes": 4096}))
    route = PublicRelayRoute(shared, settings.model_copy(update={"relay_max_body_bytes": 4096}))
    relay = await shared.get()
    try:
        first = await relay.open_lease("a", upstream_for(fake, mode=Mode.TRANSPARENT_PROXY, token_ids=True))
        second = await relay.open_lease("b", upstream_for(fake))
        fake.app.reset([Reply(content="streamed words here")])
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=route), base_url="http://server") as http:
            async with http.stream("POST", CHAT, json={**BODY, "stream": True},
                                   headers={"authorization": f"Bearer {second.token}"}) as answer:
                assert answer.headers["content-type"].startswith("text/event-stream")
                text = "".join([chunk async for chunk in answer.aiter_text()])
            events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
            assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"]) == \
                "streamed words here"
            assert first.turns() == [] and len(second.turns()) == 1
            big = await http.post(CHAT, content=b"x" * 5000, headers={"authorization": f"Bearer {first.token}"})
            assert big.status_code == 413 and first.turns() == []
        await first.close()
        await second.close()
    finally:
        await route.aclose()
        await shared.stop()


async def test_concurrency_per_token_is_capped(settings: Settings, fake: FakeLLMServer) -> None:
    capped = settings.model_copy(update={"relay_max_calls_per_token": 2})
    shared = SharedRelay(capped)
    route = PublicRelayRoute(shared, capped)
    relay = await shared.get()
    try:
        lease = await relay.open_lease("r", upstream_for(fake))
        fake.app.reset([Reply(hang=True)])
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=route), base_url="http://server",
                                     timeout=30) as http:
            headers = {"authorization": f"Bearer {lease.token}"}
            hung = [asyncio.ensure_future(http.post(CHAT, json=BODY, headers=headers)) for _ in range(2)]
            await poll(lambda: lease.in_flight >= 2, "the two calls to reach the relay")
            third = await http.post(CHAT, json=BODY, headers=headers)
            assert third.status_code == 429 and third.json()["error"]["type"] == "concurrency_limit"
            await lease.close()  # ends the hung calls
            assert {(await call).status_code for call in hung} <= {502, 499, 401, 504}
    finally:
        await route.aclose()
        await shared.stop()


async def test_a_passed_through_dialect_gets_every_header_its_upstream_reads(
    settings: Settings, fake: FakeLLMServer
) -> None:
    """Claude Code sends `anthropic-beta` (features it uses) besides `anthropic-version`: through the public route
    as through the loopback one, a native Anthropic upstream gets both, and the server's key, never the token."""
    fake.app.native = frozenset({"anthropic"})
    shared = SharedRelay(settings)
    route = PublicRelayRoute(shared, settings)
    relay = await shared.get()
    try:
        lease = await relay.open_lease("r", upstream_for(fake, native_dialects=frozenset({"anthropic"})))
        headers = {"x-api-key": lease.token, "anthropic-version": "2023-06-01",
                   "anthropic-beta": "interleaved-thinking-2025-05-14,context-1m-2025-08-07"}
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=route), base_url="http://server") as http:
            answer = await http.post("/llm/v1/messages", headers=headers, json={
                "model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}]})
        await lease.close()
        assert answer.status_code == 200 and answer.json()["content"] == [{"type": "text", "text": "ok"}]
        [seen] = fake.app.requests
        assert seen.path == "/v1/messages"
        assert seen.headers["anthropic-beta"] == headers["anthropic-beta"]
        assert seen.headers["anthropic-version"] == "2023-06-01"
        assert seen.headers["x-api-key"] == SERVER_KEY and lease.token not in json.dumps(seen.headers)
        [turn] = lease.turns()
        assert turn.passthrough == "anthropic" and turn.message.content == "ok"
    finally:
        await route.aclose()
        await shared.stop()
