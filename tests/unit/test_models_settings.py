"""Request validation, result invariants and settings parsing."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from coding_agent_env.errors import SettingsError
from coding_agent_env.models import RolloutRequest, RolloutResult, RolloutStatus
from coding_agent_env.settings import Settings, WireLimits


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
    with pytest.raises(ValidationError, match="either endpoint or base_url"):
        RolloutRequest(instruction="x", endpoint="openai", base_url="http://h/v1", api_key="k")


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


def test_client_import_stays_light() -> None:
    import subprocess
    import sys

    code = "import sys, coding_agent_env.client; print(sorted(m for m in ('aiohttp', 'coding_agent_env.rollout.pipeline', 'coding_agent_env.sandbox.local') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"
