"""OpenCode and Pi on remote backends through the relay's public route, the key never in the sandbox.

`hf`: hf-sandbox's own in-pod server on loopback stands in for the pod (as the backend suite does), driven by a
real `coding-agent-env serve` whose `RELAY_PUBLIC_URL` is its own `/llm/v1`: the agent reaches the relay over
the network, through the server's port. `e2b`: the E2B SDK fake (tests/fakes/e2b_fake.py; E2B's cloud is
unreachable here) in-process, with the relay's own listener as the public URL (an engine on this host). The
LLM is the scripted fake (tests/fakes/llm.py)."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from coding_agent_env.client import CodingAgentEnv
from coding_agent_env.models import RolloutRequest, RolloutResult, RolloutStatus
from coding_agent_env.rollout import run_rollout
from coding_agent_env.sandbox.registry import Backends
from coding_agent_env.sandbox.remote.e2b import E2bBackend
from coding_agent_env.settings import E2bConfig, Settings
from tests.agents.conftest import SERVER_KEY
from tests.agents.sessions import CORRECT, TASK, VERIFY, session, write_file_command
from tests.backends.conftest import hf_server  # noqa: F401 (a fixture)
from tests.compat.conftest import launch_server
from tests.fakes.e2b_fake import FakeAsyncSandbox
from tests.fakes.llm import FakeLLMServer

pytestmark = pytest.mark.usefixtures("assert_no_leftovers")

AGENTS = ("opencode", "pi")
# What the agent can see of its own configuration (the token included), kept for verify's check below.
KEEP_CONFIG = 'env > agent_config.txt; cat "$PI_CODING_AGENT_DIR/models.json" >> agent_config.txt 2>/dev/null; true'
# A regex, so that the scanning command's own argv does not contain the key it looks for.
SCAN = (
    "grep -rlE 'sk-serve[r]-held' . \"$HOME\" > found.txt 2>/dev/null; "
    "for p in /proc/[0-9]*; do cat $p/environ $p/cmdline 2>/dev/null; done | tr '\\0' '\\n' "
    "| grep -cE 'sk-serve[r]-held' >> found.txt; true"
)
# After the agent's phase, its token must be dead on the route it used: 401, and nothing forwarded.
TOKEN_DEAD = """python3 - <<'EOF'
import re, sys, urllib.error, urllib.request
text = open("agent_config.txt").read()
token = re.search(r"car-[A-Za-z0-9_-]+", text).group(0)
url = re.search(r"https?://[0-9.]+:[0-9]+/[a-z0-9/]*v1", text).group(0)
request = urllib.request.Request(url + "/chat/completions", data=b'{"model": "m", "messages": []}',
                                 headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
try:
    urllib.request.urlopen(request, timeout=10)
except urllib.error.HTTPError as exc:
    sys.exit(0 if exc.code == 401 else 1)
sys.exit(1)
EOF"""


def task(fake: FakeLLMServer, agent: str, sandbox: str) -> dict[str, object]:
    return {"instruction": TASK, "agent": agent, "base_url": fake.base_url, "api_key": SERVER_KEY,
            "model": "fake/coder-1", "verify": [*VERIFY, TOKEN_DEAD], "agent_timeout_s": 120,
            "command_timeout_s": 30, "sandbox": sandbox, "mode": "transparent_proxy"}


def check(result: RolloutResult, fake: FakeLLMServer, public_prefix: str) -> None:
    assert result.status is RolloutStatus.COMPLETED, (result.error, result.agent_log_tail[-2000:])
    assert [r.exit_code for r in result.verify_results] == [0, 0], result.verify_results
    assert result.reward == 1.0 and result.network == "llm-public"
    assert result.files["found.txt"].split() == ["0"], result.files["found.txt"]
    assert public_prefix in result.files["agent_config.txt"]
    assert SERVER_KEY not in json.dumps(result.model_dump(mode="json"))
    assert len(result.proxy_turns) == len(fake.app.requests) >= 3
    assert all(seen.headers["authorization"] == f"Bearer {SERVER_KEY}" for seen in fake.app.requests)


@pytest.mark.parametrize("agent", AGENTS)
def test_hf_backend_through_the_servers_public_route(
    agent: str, fake: FakeLLMServer, hf_server: tuple[str, str], tmp_path: Path,  # noqa: F811
    require_agent: Callable[[str], None],
) -> None:
    require_agent(agent)
    url, token = hf_server
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    public = f"http://127.0.0.1:{port}/llm/v1"
    env = {"SANDBOX_BACKENDS": "local,hf", "HF_SANDBOX_URL": url, "HF_SANDBOX_TOKEN": token,
           "HF_SANDBOX_ROOT": str(tmp_path / "pods"), "HF_SANDBOX_PUBLIC_RELAY": "true",
           "HF_SANDBOX_AGENTS_DIR": str(Settings().agents_dir), "RELAY_PUBLIC_URL": public,
           "STATE_DIR": str(tmp_path / "state")}
    fake.app.script = session(agent, write_file_command("binary_search.py", CORRECT), KEEP_CONFIG, SCAN)
    with launch_server(tmp_path, env, port=port) as server, \
            CodingAgentEnv(server).sync() as client:
        client.reset()
        result = client.run_rollout(RolloutRequest.model_validate(task(fake, agent, "hf")))
    check(result, fake, public)


@pytest.mark.parametrize("agent", AGENTS)
async def test_e2b_backend_through_the_relays_listener(
    agent: str, fake: FakeLLMServer, settings: Settings, require_agent: Callable[[str], None]
) -> None:
    require_agent(agent)
    e2b = E2bConfig(root=str(settings.state_dir), public_relay=True, agents_dir=str(settings.agents_dir))
    enabled = settings.with_backends(settings.backend_config("local"), e2b)
    fake.app.script = session(agent, write_file_command("binary_search.py", CORRECT), KEEP_CONFIG, SCAN)
    async with Backends(enabled, overrides={"e2b": E2bBackend(e2b, enabled, sdk=FakeAsyncSandbox)}) as backends:
        result = await run_rollout(RolloutRequest.model_validate(task(fake, agent, "e2b")), settings=enabled,
                                   backends=backends)
    check(result, fake, "http://127.0.0.1:")


async def test_remote_llm_is_refused_unless_the_operator_enables_it(
    fake: FakeLLMServer, settings: Settings
) -> None:
    e2b = E2bConfig(root=str(settings.state_dir))
    enabled = settings.with_backends(settings.backend_config("local"), e2b)
    async with Backends(enabled, overrides={"e2b": E2bBackend(e2b, enabled, sdk=FakeAsyncSandbox)}) as backends:
        with pytest.raises(Exception, match="E2B_PUBLIC_RELAY=true") as refused:
            await run_rollout(RolloutRequest.model_validate(task(fake, "opencode", "e2b")), settings=enabled,
                              backends=backends)
    assert type(refused.value).__name__ == "BackendRefusedError" and fake.app.requests == []
