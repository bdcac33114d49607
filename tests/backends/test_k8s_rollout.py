"""An OpenCode rollout through the k8s backend and the relay's public route reaches reward 1.0, the key never in
the pod, its token dead afterwards: in-process, and through a real `coding-agent-env serve` configured only by
the K8S_* environment names whose RELAY_PUBLIC_URL is its own `/llm/v1` (the agent reaches the relay through the
server's port, as a pod would through its Service).

The cluster is the STAND-IN (tests/fakes/k8s_standin.py): its pods are containers on the real dockerd on the
host's network (the stand-in for a template NetworkPolicy that lets pods reach the server's public relay route;
never a Docker bridge), with the pre-installed agents mounted read-only (the image's baked-in agents). The
relay's own listener is the public URL (a server on this host), the LLM the scripted fake (tests/fakes/llm.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import socket
from pathlib import Path

import pytest

from coding_agent_env.client import CodingAgentEnv
from coding_agent_env.models import RolloutRequest
from coding_agent_env.rollout import run_rollout
from coding_agent_env.sandbox.registry import Backends
from coding_agent_env.settings import Settings
from coding_agent_env.settings.backends import K8sConfig
from tests.agents.conftest import fake, installed_agents, require_agent  # noqa: F401 (fixtures)
from tests.agents.sessions import CORRECT, session, write_file_command
from tests.agents.test_agents_remote import KEEP_CONFIG, SCAN, check, task
from tests.compat.conftest import launch_server
from tests.fakes.k8s_standin import K8sStandIn
from tests.fakes.llm import FakeLLMServer

pytestmark = pytest.mark.usefixtures("assert_no_leftovers")


@pytest.fixture
def host_network_cluster(docker_engine: Any, kubeconfig_path: Any, settings: Settings) -> Iterator[K8sStandIn]:
    with K8sStandIn(docker_engine, kubeconfig=kubeconfig_path, network="host",
                    binds=(str(settings.agents_dir),)) as cluster:
        yield cluster
        claims, pods = cluster.claim_names(), cluster.pods()
    assert not claims and not pods, f"claims left: {claims}; pods left: {[p.name for p in pods]}"


async def test_opencode_through_the_k8s_backend_and_the_public_relay_route(
    fake: FakeLLMServer, settings: Settings, host_network_cluster: K8sStandIn,  # noqa: F811
    require_agent: Callable[[str], None],  # noqa: F811
) -> None:
    require_agent("opencode")
    k8s = K8sConfig(router_url=host_network_cluster.router_url, server_id=f"test-{host_network_cluster.id}",
                    public_relay=True, agents_dir=str(settings.agents_dir))
    enabled = settings.with_backends(settings.backend_config("local"), k8s)
    fake.app.script = session("opencode", write_file_command("binary_search.py", CORRECT), KEEP_CONFIG, SCAN)
    async with Backends(enabled) as backends:
        result = await run_rollout(RolloutRequest.model_validate(task(fake, "opencode", "k8s")), settings=enabled,
                                   backends=backends)
    check(result, fake, "http://127.0.0.1:")
    assert result.isolation == "k8s-pod"
    assert host_network_cluster.created and host_network_cluster.claim_names() == []


def test_opencode_through_a_served_k8s_backend_configured_by_its_environment_names(
    fake: FakeLLMServer, settings: Settings, host_network_cluster: K8sStandIn, tmp_path: Path,  # noqa: F811
    require_agent: Callable[[str], None],  # noqa: F811
) -> None:
    require_agent("opencode")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    public = f"http://127.0.0.1:{port}/llm/v1"
    env = {"SANDBOX_BACKENDS": "local,k8s", "K8S_NAMESPACE": "default", "K8S_SANDBOX_TEMPLATE": "coding-agent-env",
           "K8S_SANDBOX_ROUTER_URL": host_network_cluster.router_url, "K8S_SERVER_ID": f"served-{port}",
           "K8S_PUBLIC_RELAY": "true", "K8S_AGENTS_DIR": str(settings.agents_dir), "K8S_CLAIM_TIMEOUT_S": "60",
           "KUBECONFIG": str(host_network_cluster.kubeconfig), "RELAY_PUBLIC_URL": public,
           "STATE_DIR": str(tmp_path / "state")}
    fake.app.script = session("opencode", write_file_command("binary_search.py", CORRECT), KEEP_CONFIG, SCAN)
    with launch_server(tmp_path, env, port=port) as server, CodingAgentEnv(server).sync() as client:
        client.reset()
        result = client.run_rollout(RolloutRequest.model_validate(task(fake, "opencode", "k8s")))
    check(result, fake, public)
    assert result.isolation == "k8s-pod"
    labels = host_network_cluster.created[0]["metadata"]["labels"]
    assert labels["coding-agent-env/server"] == f"served-{port}"
