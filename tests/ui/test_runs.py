"""The web tab's rollouts run through `Session.run` like every other session: one slot, the server's relay."""

from __future__ import annotations

import pytest

from coding_agent_env.agents import registry
from coding_agent_env.api.ui.rollouts import Progress, UiRuns
from coding_agent_env.models import RolloutRequest, RolloutStatus
from coding_agent_env.session import SessionManager
from coding_agent_env.settings import Settings
from tests.fakes.llm import FakeLLM, FakeLLMServer, Reply

KEY = "sk-web-tab-SECRET-0123456789"


@pytest.fixture(autouse=True)
def probe_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    # The registry is the public extension point: "pi" stands in for an LLM agent here.
    monkeypatch.setitem(registry.AGENTS, "pi", "tests.e2e.llm_probe:ProbeAgent")


async def test_an_llm_rollout_from_the_tab_uses_the_servers_relay(settings: Settings, assert_no_leftovers: None) -> None:
    manager = SessionManager(settings)
    runs = UiRuns(manager)
    seen_active: list[int] = []
    with FakeLLMServer(FakeLLM(api_key=KEY)) as fake:
        fake.app.script = [Reply(content="hello from the model")]
        request = RolloutRequest(instruction="say hi", agent="pi", base_url=fake.base_url, api_key=KEY, model="m",
                                 verify=["grep -qx 'hello from the model' answer.txt"], command_timeout_s=30)
        try:
            progress: list[Progress] = []
            async for snapshot in runs.stream("browser-1", request):
                progress.append(snapshot)
                seen_active.append(manager.active)
            shared = manager.relay.running
        finally:
            await runs.stop()
            await manager.stop()
    result = progress[-1].result
    assert result is not None and result.status is RolloutStatus.COMPLETED and result.reward == 1.0
    assert len(result.proxy_turns) == 1 and any("agent exited with 0" in line for line in progress[-1].lines)
    assert shared is not None, "the rollout started a private relay instead of using the server's"
    assert set(seen_active) == {1} and manager.active == 0  # one slot while it ran, freed after
