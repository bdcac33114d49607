"""The real agents (OpenCode and Pi from the shared npm prefix, the built-in Terminus) through the real pipeline
on the Docker backend, against the scripted fake LLM behind the relay (network policy `llm`: the relay's unix
socket bind-mounted, a forwarder inside the container).

The test image holds no programs: the host's /usr is bound read-only (node and python3 come from there) and
the agents prefix (`Settings.agents_dir`) is bound read-only too, so nothing is downloaded per rollout.
Skipped without a Docker daemon (a failure under CI, see tests/backends/conftest.py)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from coding_agent_env.models import RolloutStatus
from coding_agent_env.rollout import run_rollout
from tests.agents.conftest import SERVER_KEY
from tests.agents.sessions import AGENTS, CORRECT, session, write_file_command
from tests.agents.test_agents_e2e import SCAN, request
from tests.backends.conftest import Target, backend_for, docker_engine, no_leftover_containers  # noqa: F401 (fixtures)
from tests.fakes.llm import FakeLLMServer

pytestmark = pytest.mark.usefixtures("assert_no_leftovers")


@pytest.mark.parametrize("agent", AGENTS)
async def test_binary_search_on_docker_scores_one_and_the_key_stays_out(
    agent: str, fake: FakeLLMServer, backend_for: Callable[[str], Target], require_agent: Callable[[str], None],
) -> None:
    require_agent(agent)
    name, settings, backends = backend_for("docker")  # also: no container of this process is left afterwards
    fake.app.script = session(agent, write_file_command("binary_search.py", CORRECT), SCAN)
    result = await run_rollout(request(fake, agent, sandbox=name, mode="transparent_proxy", top_logprobs=2),
                               settings=settings, backends=backends)
    assert result.status is RolloutStatus.COMPLETED, (result.error, result.agent_log_tail)
    network = "none" if agent == "terminus" else "llm"  # Terminus calls the relay from the server
    assert (result.sandbox, result.isolation, result.network) == ("docker", "docker", network)
    assert result.reward == 1.0 and result.agent_exit_code == 0, (result.verify_results, result.agent_log_tail)
    assert result.files["binary_search.py"] == CORRECT
    # The scan ran as the agent's own tool call inside the container: no key in files, argv or environments.
    assert result.files["found.txt"].split() == ["0"], result.files["found.txt"]
    assert int(result.files["seen_lines.txt"]) > 10
    assert SERVER_KEY not in json.dumps(result.model_dump(mode="json"))
    assert all(seen.headers["authorization"] == f"Bearer {SERVER_KEY}" for seen in fake.app.requests)
    assert len(result.proxy_turns) == len(fake.app.requests) >= 3
    traced = [t for t in result.proxy_turns if t.completion_token_ids]
    assert traced and all(t.per_token_logps and len(t.per_token_logps) == len(t.completion_token_ids)
               for t in traced)
    events = result.agent_events
    assert events is not None and events.steps >= 1 and events.tool_calls, events


async def test_terminus_on_docker_through_engine_execs(
    fake: FakeLLMServer, backend_for: Callable[[str], Target], require_agent: Callable[[str], None],
) -> None:
    """The transport for daemons not on this host (machinery copied in, commands as engine execs), chosen here."""
    require_agent("terminus")
    name, settings, backends = backend_for("docker-exec")
    fake.app.script = session("terminus", write_file_command("binary_search.py", CORRECT),
                              "mkdir -p sub && cd sub && export KEPT=yes", 'echo "$KEPT $PWD" > /workspace/state.txt')
    result = await run_rollout(request(fake, "terminus", sandbox=name), settings=settings, backends=backends)
    assert result.status is RolloutStatus.COMPLETED and result.reward == 1.0, (result.error, result.agent_log_tail)
    assert result.files["state.txt"] == "yes /workspace/sub\n"  # shell state kept between engine execs
    # Its loop runs in the server: the container needs no route to the relay.
    assert result.network == "none" and len(result.proxy_turns) == len(fake.app.requests) >= 2


LATE_CALL = r"""python3 - <<'EOF'
import json, urllib.error, urllib.request
provider = json.load(open("/logs/agent/pi/models.json"))["providers"]["relay"]
call = urllib.request.Request(provider["baseUrl"] + "/chat/completions", data=b'{"messages": []}',
                              headers={"Authorization": "Bearer " + provider["apiKey"]})
try:
    print("status", urllib.request.urlopen(call, timeout=10).status)
except urllib.error.HTTPError as exc:
    print("status", exc.code)
EOF"""


async def test_the_agents_token_is_worthless_once_its_phase_ends(
    fake: FakeLLMServer, backend_for: Callable[[str], Target], require_agent: Callable[[str], None],
) -> None:
    """In a container the forwarder serves every process, and Pi's config file (holding the token) is still
    there when verify runs code the agent wrote. Verify reads it and calls the relay: refused (401), and no
    turn is added after the agent's."""
    require_agent("pi")
    name, settings, backends = backend_for("docker")
    fake.app.script = session("pi", write_file_command("binary_search.py", CORRECT))
    result = await run_rollout(request(fake, "pi", sandbox=name, verify=[LATE_CALL]), settings=settings,
                               backends=backends)
    assert result.status is RolloutStatus.COMPLETED, (result.error, result.agent_log_tail)
    assert result.verify_results[0].stdout.split() == ["status", "401"], result.verify_results[0]
    assert len(result.proxy_turns) == len(fake.app.requests) == 2
