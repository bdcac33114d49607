"""The trainer side sends the caller token from API_TOKEN (INTEGRITY 39): TRL's `CodingEnvironment` (episodes) and
the loop-owning `RolloutSessionFactory` (rollouts) run on a server that requires it, and without it fail with the
typed error naming the 401. Real server (uvicorn in a thread, bubblewrap)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from coding_agent_env.harness import CodingEnvironment, ServerUnreachableError
from coding_agent_env.harness.rollouts import RolloutSessionFactory
from coding_agent_env.settings import Settings
from tests.helpers import leftovers, wait_until
from tests.protocol.live import ORACLE_TASK, LiveServer

TOKEN = "trainer-token-0b8e"
TASK = {"instruction": "Put 42 in answer.txt.", "verify": ["grep -qx 42 answer.txt"], "sandbox": "local"}


@pytest.fixture
def guarded(make_live: Callable[..., LiveServer]) -> LiveServer:
    return make_live(api_token=TOKEN, enable_web_interface=False)


def test_coding_environment_sends_api_token(guarded: LiveServer, settings: Settings,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("API_TOKEN", raising=False)
    with pytest.raises(ServerUnreachableError, match="401"):
        CodingEnvironment(guarded.http, connect_timeout_s=10).reset(prompt=[], **TASK)
    monkeypatch.setenv("API_TOKEN", TOKEN)
    env = CodingEnvironment(guarded.http, message_timeout_s=60)
    env.reset(prompt=[], **TASK)
    assert env.terminal("echo 42 > answer.txt") == "[exit code 0]"
    assert env.get_reward() == 1.0
    env.close()
    wait_until(lambda: guarded.sessions.active == 0 and not leftovers(settings), what="the session gone")


def test_rollout_sessions_send_api_token(guarded: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("API_TOKEN", raising=False)
    with pytest.raises(ServerUnreachableError, match="401"):
        RolloutSessionFactory(guarded.http).create(ORACLE_TASK)
    monkeypatch.setenv("API_TOKEN", TOKEN)
    session = RolloutSessionFactory(guarded.http).create(ORACLE_TASK)
    try:
        assert session.wait_for_completion(120) == 0
        assert session.result.reward == 1.0
    finally:
        session.close()
