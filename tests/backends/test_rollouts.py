"""The example task (oracle agent, binary search) end to end on every backend, and backend selection."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from coding_agent_env.cli.main import load_task
from coding_agent_env.errors import BackendRefusedError, MissingExtraError, UnknownBackendError
from coding_agent_env.models import RolloutRequest, RolloutStatus
from coding_agent_env.rollout import run_rollout
from coding_agent_env.workspace.budget import Budget
from coding_agent_env.sandbox import Backends
from coding_agent_env.sandbox.base import REMOTE_LIFETIME_MARGIN_S
from coding_agent_env.sandbox.registry import import_backend
from coding_agent_env.settings import DockerConfig, E2bConfig, HfConfig, Settings
from tests.backends.conftest import Target

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "binary_search.yaml"
SHADOW_UNITTEST = (
    "mkdir -p unittest && printf 'import sys\\nsys.exit(0)\\n' > unittest/__main__.py && touch unittest/__init__.py"
)


# What each backend really gives the example task (network policy `none`): isolation, network, and the
# limits it enforces itself.
_WHOLE = {"memory", "pids", "nano_cpus", "disk"}
"""Sandbox-wide limits: a local sandbox's control group and tmpfs (as root), a container's own."""
_IN_EFFECT = {
    "local": ("bwrap", "none", {"data", "fsize", "cpu"} | _WHOLE),  # the group's pids, not RLIMIT_NPROC
    "local-unisolated": ("none", "host", {"data", "fsize", "cpu"} | _WHOLE),  # no netns
    "docker": ("docker", "none", {"data", "fsize", "cpu"} | _WHOLE),
    "hf": ("none", "host", {"data", "fsize", "cpu"}),
    "e2b-fake": ("e2b", "none", {"data", "fsize", "cpu"}),
}


@pytest.mark.parametrize("kind", list(_IN_EFFECT))
async def test_oracle_binary_search_passes(kind: str, backend_for: Callable[[str], Target],
                                           assert_no_leftovers: None) -> None:
    name, settings, backends = backend_for(kind)
    task = load_task(str(EXAMPLE)).model_copy(update={"sandbox": name})
    result = await run_rollout(task, settings=settings, backends=backends)
    assert result.status is RolloutStatus.COMPLETED and result.reward == 1.0, result.error
    isolation, network, limits = _IN_EFFECT[kind]
    assert (result.sandbox, result.isolation, result.network) == (name, isolation, network)
    assert limits <= set(result.limits) and result.limits["data"] == settings.sandbox_memory_mb * 1024 * 1024
    assert set(result.limit_scopes) == set(result.limits) and not result.limits_hit
    assert {name for name, scope in result.limit_scopes.items() if scope == "process"} == {"data", "fsize", "cpu"}
    assert "NotImplementedError" not in result.files["search.py"]


@pytest.mark.parametrize("kind", list(_IN_EFFECT))
async def test_shadowing_unittest_scores_zero_in_the_clean_room(kind: str, backend_for: Callable[[str], Target],
                                                                assert_no_leftovers: None) -> None:
    """The example verifies in a clean room on every backend: a planted `unittest/` package that makes
    `python3 -m unittest` exit 0 never reaches it (in the agent's workspace it scores 1.0)."""
    name, settings, backends = backend_for(kind)
    task = load_task(str(EXAMPLE)).model_copy(update={"sandbox": name, "solution": [SHADOW_UNITTEST]})
    result = await run_rollout(task, settings=settings, backends=backends)
    assert result.status is RolloutStatus.COMPLETED and result.reward == 0.0, result.error
    assert result.verify_context == "clean_room" and result.artifacts is not None
    assert result.artifacts.copied == ["search.py"]
    assert "unittest/__main__.py" in result.files  # it was there, in the agent's workspace


async def test_only_enabled_backends_are_selectable(settings: Settings) -> None:
    async with Backends(settings) as backends:  # default settings enable only `local`
        with pytest.raises(UnknownBackendError, match="not enabled"):
            backends.get("docker")
        with pytest.raises(UnknownBackendError, match="not enabled"):
            backends.resolve("docker")
        assert backends.resolve(None) == "local"


def test_missing_sdk_names_the_extra() -> None:
    with pytest.raises(MissingExtraError, match=r"pip install 'coding-agent-env\[ghost\]'"):
        import_backend("tests.backends.ghost_backend:GhostBackend", "ghost", "ghost")


async def test_a_backend_whose_sdk_is_missing_refuses_the_request(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The e2b extra not installed (its SDK made unimportable here): a rollout there is a request error naming
    the extra, before anything runs."""
    monkeypatch.setitem(sys.modules, "e2b", None)  # `import e2b` now fails as if it were not installed
    monkeypatch.delitem(sys.modules, "coding_agent_env.sandbox.remote.e2b", raising=False)
    enabled = settings.with_backends(*settings.backends, E2bConfig(root=str(settings.state_dir)))
    task = load_task(str(EXAMPLE)).model_copy(update={"sandbox": "e2b"})
    with pytest.raises(BackendRefusedError, match=r"pip install 'coding-agent-env\[e2b\]'"):
        await run_rollout(task, settings=enabled)


async def test_docker_check_reports_a_missing_daemon(settings: Settings, tmp_path: Path) -> None:
    async with Backends(settings.with_backends(DockerConfig(host=f"unix://{tmp_path}/none.sock"))) as backends:
        status = backends.get("docker").check()
    assert not status.available and "no usable Docker daemon" in status.detail


async def test_remote_backends_check_reports_missing_credentials(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "")
    monkeypatch.setenv("HF_HOME", "/nonexistent-hf-home")
    async with Backends(settings.with_backends(HfConfig(), E2bConfig())) as backends:
        assert not backends.get("e2b").check().available
        assert not backends.get("hf").check().available


async def test_remote_sandbox_lives_as_long_as_the_rollout_and_not_much_longer(
    backend_for: Callable[[str], Target], assert_no_leftovers: None
) -> None:
    """A self-ending sandbox (E2B VM, HF Job) must outlive the rollout's deadline, and one left by a crashed
    server must not run for hours: its lifetime is the deadline plus a fixed margin. (E2B SDK faked.)"""
    from tests.fakes.e2b_fake import FakeAsyncSandbox

    name, settings, backends = backend_for("e2b-fake")
    task = load_task(str(EXAMPLE)).model_copy(update={"sandbox": name, "agent_timeout_s": 900})
    result = await run_rollout(task, settings=settings, backends=backends)
    assert result.reward == 1.0, result.error
    [made] = [c for c in FakeAsyncSandbox.created if c["metadata"]["coding-agent-env.rollout"] == result.rollout_id]
    deadline = Budget.for_request(task, settings).total_s
    assert deadline > 900 and deadline <= made["timeout"] <= deadline + REMOTE_LIFETIME_MARGIN_S + 1


@pytest.mark.parametrize("kind", list(_IN_EFFECT))
async def test_terminus_solves_the_task_on_every_backend(kind: str, backend_for: Callable[[str], Target],
                                                         assert_no_leftovers: None) -> None:
    """Terminus's loop runs in the server and its commands are the backend's own execs: it needs no network
    policy, so it runs even where `llm` is not offered (hf, e2b). The LLM is the scripted fake."""
    from tests.agents.sessions import CORRECT, TASK, VERIFY, session, write_file_command
    from tests.fakes.llm import FakeLLM, FakeLLMServer

    name, settings, backends = backend_for(kind)
    with FakeLLMServer(FakeLLM(api_key="sk-every-backend")) as fake:
        fake.app.script = session("terminus", write_file_command("binary_search.py", CORRECT), "cd /tmp", "pwd")
        request = RolloutRequest(instruction=TASK, agent="terminus", sandbox=name, base_url=fake.base_url,
                                 api_key="sk-every-backend", model="fake/m", verify=VERIFY)
        result = await run_rollout(request, settings=settings, backends=backends)
        calls = len(fake.app.requests)
    assert result.status is RolloutStatus.COMPLETED and result.reward == 1.0, (result.error, result.agent_log_tail)
    isolation, network, _ = _IN_EFFECT[kind]
    assert (result.sandbox, result.isolation, result.network) == (name, isolation, network)
    assert len(result.proxy_turns) == calls == 4
    assert result.agent_events is not None and [t.input for t in result.agent_events.tool_calls][-1] == "pwd"
    assert "/tmp" in (result.proxy_turns[-1].request_messages[-1].get("content") or "")  # cwd kept between execs
