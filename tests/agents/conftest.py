"""The agent suite runs the real CLI agents: their pinned npm packages must be in the agents dir.

`.ci/run` installs them (`coding-agent-env agents install`). If they are missing, the suite installs them
once itself; if npm or its registry is unreachable, the tests that need them skip and say why."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from coding_agent_env.agents.install import AgentInstallError, install, status
from coding_agent_env.agents.registry import cli_specs
from coding_agent_env.settings import Settings
from tests.fakes.llm import FakeLLM, FakeLLMServer

SERVER_KEY = "sk-server-held-SECRET-0123456789"


@pytest.fixture(scope="session")
def installed_agents() -> dict[str, str]:
    """Agent name -> why it cannot run ('' when it can); installs missing agents once."""
    agents_dir = Settings().agents_dir
    problems: dict[str, str] = {}
    for spec in cli_specs():
        if status(spec, agents_dir).installed:
            problems[spec.name] = ""
            continue
        try:
            install(spec, agents_dir)
            problems[spec.name] = ""
        except AgentInstallError as exc:
            problems[spec.name] = f"{spec.name} {spec.version} could not be installed from npm: {exc}"
    return problems


@pytest.fixture
def require_agent(installed_agents: dict[str, str]):  # type: ignore[no-untyped-def]
    def check(name: str) -> None:
        if installed_agents.get(name):
            pytest.skip(installed_agents[name])

    return check


@pytest.fixture
def fake() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(FakeLLM(api_key=SERVER_KEY)) as server:
        yield server
