"""Unisolated commands are refused while the server holds operator secrets (INTEGRITY 38), whatever
SANDBOX_ALLOW_UNISOLATED says, unless the operator's second opt-in SANDBOX_ALLOW_UNISOLATED_WITH_SECRETS is set.
Real local backend; bubblewrap is made unusable (`/bin/false`) where the test needs the unisolated fallback."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coding_agent_env.errors import BackendRefusedError
from coding_agent_env.models import RolloutRequest
from coding_agent_env.rollout import run_rollout
from coding_agent_env.sandbox import Backends
from coding_agent_env.settings import Settings
from tests.helpers import with_local

MARKER = "ran-unisolated"


@pytest.fixture
def drop() -> Iterator[Path]:
    """A host directory any sandbox uid may write to (pytest's tmp_path is 0700: a command could not write
    there, and a missing marker would prove nothing)."""
    path = Path(tempfile.mkdtemp(prefix="cae-drop-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path)


def holding(settings: Settings, **secrets: Any) -> Settings:
    """`settings` with `secrets` set (validated, as the environment would give them)."""
    return Settings.model_validate({**dict(settings), **secrets})


def request(drop: Path) -> RolloutRequest:
    """An oracle whose command, run at all, leaves a file outside any sandbox."""
    marker = drop / MARKER
    return RolloutRequest(instruction="x", agent="oracle", solution=[f"touch {marker}"], verify=["true"])


SECRET_SETTINGS: dict[str, dict[str, Any]] = {
    "openai": {"openai_api_key": "sk-held"},
    "hf": {"hf_token": "hf_held"},
    "caller token": {"api_token": "tok"},
    "endpoint key": {"llm_endpoints": {"mine": {"base_url": "http://127.0.0.1:9/v1", "api_key": "k"}}},
}
UNISOLATED: dict[str, dict[str, Any]] = {
    "isolation none": {"isolation": "none"},
}
"""The unisolated mode every kernel gives. The other, bubblewrap unusable with SANDBOX_ALLOW_UNISOLATED, falls back to
the Landlock tier where the kernel has Landlock (as here): `test_the_fallback_is_landlock_and_holds_secrets_safe`."""
FALLBACK = {"bwrap_path": "/bin/false", "allow_unisolated": True}


@pytest.mark.parametrize("secret", sorted(SECRET_SETTINGS))
@pytest.mark.parametrize("mode", sorted(UNISOLATED))
async def test_unisolated_commands_are_refused_while_secrets_are_held(
    settings: Settings, drop: Path, secret: str, mode: str
) -> None:
    held = holding(with_local(settings, **UNISOLATED[mode]), **SECRET_SETTINGS[secret])
    variable = held.configured_secrets[0]
    with pytest.raises(BackendRefusedError, match="SANDBOX_ALLOW_UNISOLATED_WITH_SECRETS") as refused:
        await run_rollout(request(drop), settings=held)
    assert variable.split(".")[0] in str(refused.value) and "sk-held" not in str(refused.value)
    assert not (drop / MARKER).exists()
    async with Backends(held) as backends:
        status = backends.get("local").check()
    assert not status.available and "operator secrets" in status.detail


@pytest.mark.parametrize("mode", sorted(UNISOLATED))
async def test_the_second_opt_in_runs_them_and_says_so(settings: Settings, drop: Path, mode: str) -> None:
    held = with_local(settings, **UNISOLATED[mode], allow_unisolated_with_secrets=True)
    held = holding(held, openai_api_key="sk-held")
    result = await run_rollout(request(drop), settings=held)
    assert (result.isolation, result.reward) == ("none", 1.0) and (drop / MARKER).exists()


async def test_isolated_commands_run_with_secrets_held(settings: Settings, drop: Path) -> None:
    held = holding(settings, openai_api_key="sk-held")
    result = await run_rollout(request(drop), settings=held)
    assert result.isolation == "bwrap" and result.reward == 1.0
    assert not (drop / MARKER).exists()  # the host path is not in the sandbox


async def test_without_secrets_the_first_opt_in_is_enough(settings: Settings, drop: Path) -> None:
    result = await run_rollout(request(drop), settings=with_local(settings, **UNISOLATED["isolation none"]))
    assert (result.isolation, result.reward) == ("none", 1.0)


def test_the_second_opt_in_is_read_from_its_variable() -> None:
    env = {"SANDBOX_ALLOW_UNISOLATED_WITH_SECRETS": "true", "OPENAI_API_KEY": "sk", "API_TOKEN": "t"}
    settings = Settings.from_env(env)
    assert settings.backend_config("local").allow_unisolated_with_secrets  # type: ignore[union-attr]
    assert settings.configured_secrets == ("API_TOKEN", "OPENAI_API_KEY")
    assert Settings.from_env({}).configured_secrets == ()


async def test_the_fallback_is_landlock_and_holds_secrets_safe(settings: Settings, drop: Path) -> None:
    """With bubblewrap unusable and SANDBOX_ALLOW_UNISOLATED set, a kernel with Landlock gives its tier, not
    unisolated commands: holding secrets is no reason to refuse, and the command cannot write outside its sandbox.
    Without Landlock the fallback is unisolated, and refused while secrets are held."""
    held = holding(with_local(settings, **FALLBACK), openai_api_key="sk-held")
    async with Backends(held) as backends:
        status = backends.get("local").check()
    if status.isolation != "landlock":
        assert not status.available and "SANDBOX_ALLOW_UNISOLATED_WITH_SECRETS" in status.detail, status
        return
    result = await run_rollout(request(drop), settings=held)
    assert result.isolation == "landlock" and result.error is None, result.error
    assert result.agent_exit_code not in (0, None)  # its `touch` outside its writable places was denied...
    assert not (drop / MARKER).exists()  # ...and left nothing there
