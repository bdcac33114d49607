"""Request validation, result invariants and settings parsing."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from coding_agent_env.errors import SettingsError, UnknownBackendError
from coding_agent_env.models import RolloutRequest, RolloutResult, RolloutStatus
from coding_agent_env.settings import DockerConfig, E2bConfig, HfConfig, LocalConfig, Settings, WireLimits


def test_files_paths_are_normalised_and_confined() -> None:
    request = RolloutRequest(instruction="x", files={"a//b/./c.txt": "1", "d e/f": "2"})
    assert list(request.files) == ["a/b/c.txt", "d e/f"]
    for bad in ("../x", "/abs", "a/../../x", "", ".", "a\x00b", "\\windows"):
        with pytest.raises(ValidationError):
            RolloutRequest(instruction="x", files={bad: ""})


def test_sizes_are_bounded() -> None:
    with pytest.raises(ValidationError):
        RolloutRequest(instruction="x" * (WireLimits.MAX_INSTRUCTION_CHARS + 1))
    with pytest.raises(ValidationError):
        RolloutRequest(instruction="x", setup=["true"] * (WireLimits.MAX_COMMANDS + 1))
    with pytest.raises(ValidationError):
        RolloutRequest(instruction="x", agent_timeout_s=0)
    assert RolloutRequest(instruction="x" * 1_000_000).instruction == "x" * 1_000_000


def test_api_key_is_secret_in_reprs_and_dumps() -> None:
    request = RolloutRequest(instruction="x", base_url="http://h/v1", api_key="sk-secret-value")
    assert "sk-secret-value" not in repr(request) and "sk-secret-value" not in request.model_dump_json()
    with pytest.raises(ValidationError, match="api_key"):
        RolloutRequest(instruction="x", base_url="http://h/v1")
    with pytest.raises(ValidationError, match="api_key"):  # a named endpoint's key never goes to the caller's URL
        RolloutRequest(instruction="x", endpoint="openai", base_url="http://h/v1")


def test_unknown_fields_are_refused() -> None:
    with pytest.raises(ValidationError, match="extra"):
        RolloutRequest.model_validate({"instruction": "x", "instructions": "typo"})


def test_result_reward_must_be_in_range() -> None:
    base = {"rollout_id": "r", "agent": "nop", "sandbox": "local", "status": RolloutStatus.COMPLETED}
    assert RolloutResult.model_validate(base | {"reward": 1.0}).reward == 1.0
    for bad in (1.5, -0.1, float("nan")):
        with pytest.raises(ValidationError):
            RolloutResult.model_validate(base | {"reward": bad})


def test_settings_from_env_reads_upper_case_names_once() -> None:
    settings = Settings.from_env({"SANDBOX_BACKENDS": "local, docker", "MAX_CONCURRENT_ENVS": "3", "UNRELATED": "x"})
    assert settings.sandbox_backends == ("local", "docker") and settings.default_backend == "local"
    assert settings.max_concurrent_envs == 3
    with pytest.raises(SettingsError, match="MAX_CONCURRENT_ENVS"):
        Settings.from_env({"MAX_CONCURRENT_ENVS": "many"})
    with pytest.raises(SettingsError, match="SANDBOX_BACKENDS"):
        Settings.from_env({"SANDBOX_BACKENDS": " , "})
    with pytest.raises(SettingsError, match="SANDBOX_BACKENDS: unknown sandbox backend 'ghost'"):
        Settings.from_env({"SANDBOX_BACKENDS": "local,ghost"})


def test_each_backend_is_configured_from_its_own_variables() -> None:
    settings = Settings.from_env({
        "SANDBOX_BACKENDS": "docker,local,hf,e2b", "BWRAP_PATH": "/opt/bwrap", "SANDBOX_UID_BASE": "5000",
        "SANDBOX_UID_COUNT": "8", "SANDBOX_RELAY_PORT": "9001", "LOCAL_ISOLATION": "none",
        "DOCKER_HOST": "unix:///d.sock", "DOCKER_IMAGE": "img:1", "DOCKER_HOST_BINDS": "/usr, /opt",
        "DOCKER_RELAY_PORT": "9002", "DOCKER_TRANSPORT": "exec", "DOCKER_FORK": "image", "HF_SANDBOX_URL": "http://127.0.0.1:1",
        "HF_SANDBOX_TOKEN": "hf-token", "HF_SANDBOX_IMAGE": "py", "E2B_API_KEY": "e2b-key", "E2B_TEMPLATE": "tpl",
    })
    assert settings.sandbox_backends == ("docker", "local", "hf", "e2b") and settings.default_backend == "docker"
    local, docker, hf, e2b = (settings.backend_config(name) for name in ("local", "docker", "hf", "e2b"))
    assert local == LocalConfig(bwrap_path="/opt/bwrap", uid_base=5000, uid_count=8, relay_port=9001, isolation="none")
    assert docker == DockerConfig(host="unix:///d.sock", image="img:1", host_binds=("/usr", "/opt"),
                                  relay_port=9002, transport="exec", fork="image")
    assert isinstance(hf, HfConfig) and hf.url == "http://127.0.0.1:1" and hf.image == "py"
    assert hf.token is not None and hf.token.get_secret_value() == "hf-token"
    assert isinstance(e2b, E2bConfig) and e2b.template == "tpl"
    assert e2b.api_key is not None and e2b.api_key.get_secret_value() == "e2b-key"
    # A backend that is not enabled reads nothing, and is not there.
    assert Settings.from_env({"DOCKER_RELAY_PORT": "not read"}).sandbox_backends == ("local",)
    with pytest.raises(UnknownBackendError, match="not enabled"):
        Settings.from_env({}).backend_config("docker")


def test_an_invalid_backend_value_names_its_variable() -> None:
    with pytest.raises(SettingsError, match="DOCKER_RELAY_PORT"):
        Settings.from_env({"SANDBOX_BACKENDS": "docker", "DOCKER_RELAY_PORT": "many"})
    with pytest.raises(SettingsError, match="LOCAL_ISOLATION"):
        Settings.from_env({"LOCAL_ISOLATION": "sometimes"})
    with pytest.raises(ValidationError, match="enabled once"):
        Settings(backends=(LocalConfig(), LocalConfig(isolation="none")))


def test_client_import_stays_light() -> None:
    import subprocess
    import sys

    code = "import sys, coding_agent_env.client; print(sorted(m for m in ('aiohttp', 'coding_agent_env.rollout.pipeline', 'coding_agent_env.sandbox.local') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"


UPSTREAM_ARGUMENTS = {
    "endpoint": "", "base_url": "", "api_key": "", "model": "", "instruction": "Do it.", "setup": None, "verify": None,
    "task_id": "", "mode": "transparent_proxy", "disable_thinking": None, "max_tokens_cap": 4096, "top_logprobs": 5,
    "agent_timeout_s": 600.0, "template": "",
}
"""What OpenEnv's `OpenCodeEnv.run_rollout` sends when given only an instruction."""


def test_upstream_clients_argument_set_means_not_given() -> None:
    request = RolloutRequest.model_validate(UPSTREAM_ARGUMENTS)
    assert (request.endpoint, request.base_url, request.api_key, request.model, request.task_id, request.image) == (
        None, None, None, None, None, None)
    assert (request.setup, request.verify, request.disable_thinking, request.agent) == ([], [], None, None)
    assert (request.max_tokens_cap, request.top_logprobs, request.mode.value) == (4096, 5, "transparent_proxy")
    pi = RolloutRequest.model_validate({**UPSTREAM_ARGUMENTS, "template": None, "image": "python:3.12", "max_tokens_cap": 0})
    assert (pi.image, pi.max_tokens_cap) == ("python:3.12", None)
    assert RolloutRequest.model_validate({**UPSTREAM_ARGUMENTS, "template": "opencode-rl"}).image == "opencode-rl"
    with pytest.raises(ValidationError, match="image or template"):
        RolloutRequest.model_validate({**UPSTREAM_ARGUMENTS, "template": "a", "image": "b"})
    with pytest.raises(ValidationError, match="max_tokens_cap"):
        RolloutRequest.model_validate({**UPSTREAM_ARGUMENTS, "max_tokens_cap": -1})
    with pytest.raises(ValidationError, match="instruction"):
        RolloutRequest.model_validate({**UPSTREAM_ARGUMENTS, "instruction": ""})


def test_default_agent_setting() -> None:
    assert Settings.from_env({}).default_agent == "opencode"
    assert Settings.from_env({"DEFAULT_AGENT": "pi"}).default_agent == "pi"
    with pytest.raises(SettingsError, match="DEFAULT_AGENT"):
        Settings.from_env({"DEFAULT_AGENT": "nope"})


@pytest.mark.parametrize("env, message", [
    ({"1BAD": "x"}, "not a variable name"),
    ({"A-B": "x"}, "not a variable name"),
    ({"HOME": "/root"}, "HOME: it is the sandbox's own"),
    ({"REWARD_FILE": "/tmp/r"}, "REWARD_FILE: it is the sandbox's own"),
    ({"A": "x\x00y"}, "NUL"),
    ({"A": "x" * (WireLimits.MAX_ENV_BYTES + 1)}, "more than"),
    ({f"V{i}": "" for i in range(WireLimits.MAX_ENV_VARS + 1)}, "at most"),
])
def test_request_env_is_refused_precisely(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        RolloutRequest(instruction="x", env=env)
    assert RolloutRequest(instruction="x", env={"PATH": "/opt/x:/usr/bin", "_A1": ""}).env["PATH"] == "/opt/x:/usr/bin"
