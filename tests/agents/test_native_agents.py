"""The agents that speak a dialect other than chat completions, with an upstream that serves that dialect itself:
their calls go through the relay unchanged (`native_dialects`), and the rollout is scored and recorded as any.

Real agent binaries in the local sandbox; the upstream is the scripted fake LLM serving the dialects natively
(no real Anthropic, OpenAI or Google API here)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from coding_agent_env.models import RolloutRequest, RolloutStatus
from coding_agent_env.rollout import run_rollout
from coding_agent_env.settings import Settings
from tests.agents.conftest import SERVER_KEY
from tests.agents.sessions import CORRECT, TASK, VERIFY, session, write_file_command
from tests.fakes.llm import FakeLLMServer

DIALECT_OF = {"claude-code": "anthropic", "codex": "responses", "gemini-cli": "google"}

pytestmark = [pytest.mark.usefixtures("assert_no_leftovers"), pytest.mark.parametrize("agent", sorted(DIALECT_OF))]


async def test_an_agent_passes_its_dialect_through_to_a_native_upstream(
    agent: str, fake: FakeLLMServer, settings: Settings, require_agent: Callable[[str], None]
) -> None:
    require_agent(agent)
    dialect = DIALECT_OF[agent]
    fake.app.native = frozenset({dialect})
    fake.app.script = session(agent, write_file_command("binary_search.py", CORRECT))
    request = RolloutRequest(instruction=TASK, agent=agent, base_url=fake.base_url, api_key=SERVER_KEY,
                             model="fake/coder-1", verify=VERIFY, agent_timeout_s=120, native_dialects=[dialect])
    result = await run_rollout(request, settings=settings)
    assert result.status is RolloutStatus.COMPLETED and result.reward == 1.0, (result.error, result.agent_log_tail)
    assert result.files["binary_search.py"] == CORRECT
    # Every call reached the upstream in the agent's own dialect, none as chat completions.
    paths = {seen.path for seen in fake.app.requests}
    assert paths and not any(path.endswith("/chat/completions") for path in paths), paths
    assert len(result.proxy_turns) == len(fake.app.requests) >= 2
    assert all(turn.passthrough == dialect and turn.error is None for turn in result.proxy_turns), [
        (t.passthrough, t.error) for t in result.proxy_turns]
    assert any(call.name for turn in result.proxy_turns for call in turn.message.tool_calls)
    # No token ids in these dialects: the trace keeps the turns as context, not trained on, and says why.
    assert all(turn.trainable is False and turn.note for turn in result.proxy_turns), [
        (t.trainable, t.note) for t in result.proxy_turns]
