"""The k8s backend's own contract, beyond the suite every backend passes (test_contract.py): the claims it makes
(their wire shape, labels and shutdown time), teardown on cancellation, the reaper, refusals, settings and secrets.

Run against the STAND-IN for a Kubernetes cluster with agent-sandbox (tests/fakes/k8s_standin.py: API server,
controller and router; pods are network-less containers on the real dockerd). No cluster runs here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from coding_agent_env.errors import BackendRefusedError, SandboxUnavailableError
from coding_agent_env.sandbox import SandboxSpec
from coding_agent_env.sandbox.registry import BACKEND_CLASSES
from coding_agent_env.settings import Settings
from coding_agent_env.settings.backends import K8sConfig
from tests.backends.conftest import Target
from tests.fakes.k8s_standin import K8sStandIn
from tests.helpers import poll

pytestmark = pytest.mark.usefixtures("assert_no_leftovers")


@pytest.fixture
def k8s(backend_for: Callable[..., Target]) -> Target:
    return backend_for("k8s")


async def test_a_claim_is_a_labelled_v1beta1_claim_on_the_templates_pool(k8s: Target, k8s_standin: K8sStandIn) -> None:
    from coding_agent_env.sandbox.remote.k8s import LABEL_LIFE, LABEL_ROLLOUT, LABEL_SERVER, life

    box = await k8s.backends.get("k8s").create(SandboxSpec(rollout_id="r/1 ödd:id", deadline_s=100))
    try:
        [body] = k8s_standin.created
        config = k8s.settings.backend_config("k8s")
        assert isinstance(config, K8sConfig)
        assert body["apiVersion"] == "extensions.agents.x-k8s.io/v1beta1" and body["kind"] == "SandboxClaim"
        assert body["spec"]["warmPoolRef"] == {"name": "coding-agent-env"}
        labels = body["metadata"]["labels"]
        assert labels[LABEL_SERVER] == config.server_id and labels[LABEL_LIFE] == life()
        assert labels[LABEL_ROLLOUT] == "r-1--dd-id"
        assert body["spec"]["lifecycle"]["shutdownPolicy"] == "Delete"
        # The sandbox is the claim's bound Sandbox (a warm pool's pod, not named after the claim).
        assert box.id.startswith("coding-agent-env-") and box.isolation == "k8s-pod" and box.network == "none"
        assert k8s_standin.claim_names() == [body["metadata"]["name"]]
    finally:
        await box.close()
    assert k8s_standin.claim_names() == [] and k8s_standin.pods() == []
    await box.close()  # idempotent


async def test_a_cancelled_create_releases_its_claim(k8s: Target, k8s_standin: K8sStandIn) -> None:
    creating = asyncio.ensure_future(k8s.backends.get("k8s").create(SandboxSpec(rollout_id="cancelled")))
    await poll(lambda: k8s_standin.created, "the claim to be made")
    creating.cancel()
    with pytest.raises(asyncio.CancelledError):
        await creating
    assert k8s_standin.claim_names() == []
    await poll(lambda: not k8s_standin.pods(), "the claim's pod to go")


async def test_a_cancelled_close_still_releases_the_claim(k8s: Target, k8s_standin: K8sStandIn) -> None:
    box = await k8s.backends.get("k8s").create(SandboxSpec(rollout_id="close"))
    closing = asyncio.ensure_future(box.close())
    await asyncio.sleep(0)  # let the close start before it is cancelled
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    await poll(lambda: not k8s_standin.claim_names(), "the claim to be deleted after a cancelled close")
    await box.close()


async def test_the_reaper_deletes_only_this_servers_claims_of_other_lives(k8s: Target,
                                                                          k8s_standin: K8sStandIn) -> None:
    from coding_agent_env.sandbox.remote.k8s import LABEL_LIFE, LABEL_SERVER

    config = k8s.settings.backend_config("k8s")
    assert isinstance(config, K8sConfig)
    k8s_standin.add_claim("crashed", {LABEL_SERVER: config.server_id, LABEL_LIFE: "an-earlier-life"})
    k8s_standin.add_claim("someone-elses", {LABEL_SERVER: "another-server", LABEL_LIFE: "x"})
    backend = k8s.backends.get("k8s")
    box = await backend.create(SandboxSpec(rollout_id="after-crash"))  # the first create reaps first
    try:
        assert "crashed" not in k8s_standin.claim_names() and "someone-elses" in k8s_standin.claim_names()
        assert await backend.reap_orphans() == 0, "a server's own live claims are not orphans"
    finally:
        await box.close()
    assert k8s_standin.claim_names() == ["someone-elses"]
    assert len(k8s_standin.pods()) == 1
    other = K8sConfig(router_url=k8s_standin.router_url, server_id="another-server")
    enabled = k8s.settings.with_backends(k8s.settings.backend_config("local"), other)
    from coding_agent_env.sandbox.registry import Backends

    async with Backends(enabled) as backends:
        assert await backends.get("k8s").reap_orphans() == 1
    assert k8s_standin.claim_names() == [] and k8s_standin.pods() == []


async def test_a_missing_warm_pool_is_an_unavailable_backend_and_leaves_no_claim(
    backend_for: Callable[..., Target], k8s_standin: K8sStandIn
) -> None:
    target = backend_for("k8s")
    config = target.settings.backend_config("k8s")
    enabled = target.settings.with_backends(target.settings.backend_config("local"),
                                            config.model_copy(update={"template": "no-such-template"}))
    from coding_agent_env.sandbox.registry import Backends

    async with Backends(enabled) as backends:
        with pytest.raises(SandboxUnavailableError, match="WarmPool"):
            await backends.get("k8s").create(SandboxSpec(rollout_id="nopool"))
    assert k8s_standin.claim_names() == []


def test_network_refusals_name_their_setting(k8s: Target) -> None:
    backend = k8s.backends.get("k8s")
    assert "K8S_PUBLIC_RELAY=true" in (backend.network_refusal("llm") or "")
    assert "NetworkPolicy" in (backend.network_refusal("host") or "")
    assert backend.network_refusal("none") is None
    status = backend.check()
    assert status.available and status.isolation == "k8s-pod" and "NetworkPolicy" in status.detail


async def test_commands_environment_never_travels_in_a_command_string(k8s: Target, k8s_standin: K8sStandIn) -> None:
    secret = "sk-x '$(touch /tmp/pwn)' token-0123"
    box = await k8s.backends.get("k8s").create(SandboxSpec(rollout_id="secret"))
    try:
        done = await box.exec(["sh", "-c", 'printf %s "$TOKEN"'], env={"TOKEN": secret}, timeout=20,
                              max_output_bytes=4096)
        assert done.stdout.decode() == secret
    finally:
        await box.close()
    assert k8s_standin.commands and not [c for c in k8s_standin.commands if "token-0123" in c]


async def test_no_kubernetes_configuration_is_a_refusal_before_anything_runs(
    k8s: Target, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    reason = await k8s.backends.get("k8s").refusal()
    assert reason is not None and "Kubernetes" in reason
    with pytest.raises(BackendRefusedError, match="k8s"):
        await k8s.backends.check_usable("k8s")


def test_settings_from_the_environment_use_the_k8s_names() -> None:
    env = {"SANDBOX_BACKENDS": "local,k8s", "K8S_NAMESPACE": "agents", "K8S_SANDBOX_TEMPLATE": "tpl",
           "K8S_SANDBOX_ROUTER_URL": "http://router.agents.svc:8080", "K8S_SERVER_ID": "env-server-0",
           "K8S_PUBLIC_RELAY": "true", "K8S_AGENTS_DIR": "/opt/agents", "K8S_CLAIM_TIMEOUT_S": "42"}
    config = Settings.from_env(env).backend_config("k8s")
    assert config == K8sConfig(namespace="agents", template="tpl", router_url="http://router.agents.svc:8080",
                               server_id="env-server-0", public_relay=True, agents_dir="/opt/agents",
                               claim_timeout_s=42)
    assert BACKEND_CLASSES["k8s"] == ("coding_agent_env.sandbox.remote.k8s:K8sBackend", "k8s")
    with pytest.raises(ValueError, match="inside the runtime directory"):
        K8sConfig(root="/elsewhere")
    with pytest.raises(ValueError):
        K8sConfig(server_id="not a label value")
