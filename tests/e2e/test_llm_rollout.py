"""The LLM path through the pipeline: agent in a network-less sandbox -> relay (unix socket + in-sandbox
forwarder) -> upstream. The upstream is the scripted fake OpenAI-compatible LLM (no real model runs here);
the agent is a small probe registered for the test (the CLI agents have their own suite)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from coding_agent_env.agents import registry
from coding_agent_env.llm import Relay
from coding_agent_env.models import RolloutRequest, RolloutStatus
from coding_agent_env.rollout import run_rollout
from coding_agent_env.settings import Settings
from tests.fakes.llm import FakeLLM, FakeLLMServer, Reply
from tests.helpers import with_local

SERVER_KEY = "sk-server-held-SECRET-0123456789"
pytestmark = pytest.mark.usefixtures("assert_no_leftovers")


@pytest.fixture
def fake() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(FakeLLM(api_key=SERVER_KEY)) as server:
        yield server


@pytest.fixture(autouse=True)
def probe_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    # The registry is the public extension point: "pi" stands in for an LLM agent here.
    monkeypatch.setitem(registry.AGENTS, "pi", "tests.e2e.llm_probe:ProbeAgent")


def request(fake: FakeLLMServer, **fields: object) -> RolloutRequest:
    base = {"instruction": "say hi", "agent": "pi", "base_url": fake.base_url, "api_key": SERVER_KEY,
            "model": "Qwen/Qwen3-4B", "verify": ["grep -qx 'hello from the model' answer.txt"], "command_timeout_s": 30}
    return RolloutRequest.model_validate(base | fields)


@pytest.mark.parametrize("isolation", ["bwrap", "none"])
async def test_agent_reaches_the_model_only_through_the_relay(fake: FakeLLMServer, settings: Settings, isolation: str) -> None:
    fake.app.script = [Reply(content="hello from the model")]
    chosen = settings if isolation == "bwrap" else with_local(settings, isolation="none")
    result = await run_rollout(request(fake), settings=chosen)
    assert result.isolation == isolation
    assert result.status is RolloutStatus.COMPLETED and result.reward == 1.0, result.agent_log_tail
    [turn] = result.proxy_turns
    assert turn.message.content == "hello from the model" and turn.model == "Qwen/Qwen3-4B"
    # The time split: the agent's wait on its one LLM call, within its phase.
    assert result.timings.llm_s == pytest.approx(turn.latency_s, abs=1e-5) and 0 < result.timings.llm_s
    assert result.timings.llm_s <= result.timings.agent_s
    assert fake.app.requests[-1].headers["authorization"] == f"Bearer {SERVER_KEY}"
    assert SERVER_KEY not in json.dumps(result.model_dump(mode="json"))


async def test_server_relay_is_shared_and_tokens_are_revoked(fake: FakeLLMServer, settings: Settings) -> None:
    fake.app.script = [Reply(content="hello from the model"), Reply(content="hello from the model")]
    async with Relay(settings) as relay:
        first = await run_rollout(request(fake), settings=settings, relay=relay)
        second = await run_rollout(request(fake), settings=settings, relay=relay)
        assert first.reward == second.reward == 1.0 and len(first.proxy_turns) == len(second.proxy_turns) == 1
        # Leases end with their rollouts: nothing is left open on the shared relay.
        assert relay.state.value == "running"


async def test_the_key_never_enters_the_sandbox(fake: FakeLLMServer, settings: Settings) -> None:
    fake.app.script = [Reply(content="hello from the model")]
    # The pattern is a regex so that the scanning command's own argv does not contain the key's prefix.
    snoop = "grep -rlE 'sk-serve[r]-held' /workspace /home /tmp /logs /run > found.txt 2>/dev/null; true"
    result = await run_rollout(request(fake, verify=[snoop]), settings=settings)
    view = result.files["agent_view.txt"]
    assert "OPENAI_API_KEY=<token>" in view, "the probe saw its own environment"
    assert "sk-server" not in view and "REDACTED" not in view
    assert result.files["found.txt"] == ""


async def test_unreachable_model_is_the_agents_failure_not_a_crash(settings: Settings) -> None:
    dead = RolloutRequest(instruction="x", agent="pi", base_url="http://127.0.0.1:9/v1", api_key="k", model="m", verify=["test -s answer.txt"])
    result = await run_rollout(dead, settings=settings)
    assert result.status is RolloutStatus.AGENT_FAILED and result.reward == 0.0
    assert len(result.proxy_turns) == 1 and result.proxy_turns[0].error


async def test_a_sessions_policy_version_reaches_its_rollouts_turns(fake: FakeLLMServer, settings: Settings) -> None:
    """`reset(policy_version=...)` sets the trainer's current weights on the session: its later rollouts record it
    on every turn, unless a request names its own; a malformed one is refused and changes nothing."""
    from coding_agent_env.api.protocols.step import reset
    from coding_agent_env.errors import RequestError
    from coding_agent_env.session import SessionKind, SessionManager

    fake.app.script = [Reply(content="hello from the model")] * 2
    manager = SessionManager(settings)
    try:
        session = manager.create(SessionKind.WS)
        await reset(session, {"policy_version": "step-7", "seed": 1})
        with pytest.raises(RequestError, match="policy_version"):
            await reset(session, {"policy_version": "step 8"})
        [turn] = (await session.run(request(fake))).proxy_turns
        assert turn.policy_version == "step-7"
        [turn] = (await session.run(request(fake, policy_version="step-9"))).proxy_turns
        assert turn.policy_version == "step-9"
    finally:
        await manager.stop()
