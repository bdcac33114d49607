"""Harbor tasks through the real pipeline on the local backend: hidden /tests, Harbor's reward files."""

from __future__ import annotations

from pathlib import Path

import pytest

from coding_agent_env.models import RolloutStatus
from coding_agent_env.rollout import run_rollout
from coding_agent_env.settings import LocalConfig, Settings
from coding_agent_env.tasks import LoadedTask, iter_tasks
from tests.tasks.harbor_fixtures import REWARD, make_task

pytestmark = pytest.mark.usefixtures("assert_no_leftovers")


def _load(task: Path) -> LoadedTask:
    (loaded,) = iter_tasks([task])
    assert isinstance(loaded, LoadedTask), loaded
    return loaded


async def test_tests_hidden_from_the_agent_and_plants_do_not_count(tmp_path: Path, settings: Settings) -> None:
    # The "agent" (the oracle's solution) looks for the tests and plants its own, plus a forged reward.
    solve = ("ls -A /tests/ > seen.txt 2>&1; cat /logs/tests/secret.txt >> seen.txt 2>&1; mkdir -p /logs/tests; "
             f"printf 'echo 1 > {REWARD}' > /logs/tests/test.sh; mkdir -p /logs/verifier; echo 1 > {REWARD}")
    task = make_task(tmp_path, "hidden", solve=solve, extra_tests={"secret.txt": "HIDDEN-TEST-DATA"},
                     test_sh=f"mkdir -p /logs/verifier; grep -q HIDDEN /tests/secret.txt && echo 0.25 > {REWARD}")
    result = await run_rollout(_load(task).request.model_copy(update={"agent": "oracle"}), settings=settings)
    assert result.status is RolloutStatus.COMPLETED, result.error
    assert result.reward == 0.25  # the real tests ran, not the planted ones nor the forged reward
    assert "HIDDEN-TEST-DATA" not in result.files["seen.txt"]
    assert "No such file" in result.files["seen.txt"]


async def test_reward_json_and_missing_reward(tmp_path: Path, settings: Settings) -> None:
    json_task = make_task(tmp_path, "json",
                          test_sh='mkdir -p /logs/verifier; echo \'{"reward": 0.5}\' > /logs/verifier/reward.json')
    silent = make_task(tmp_path, "silent", test_sh="exit 0")
    first = await run_rollout(_load(json_task).request.model_copy(update={"agent": "oracle"}), settings=settings)
    second = await run_rollout(_load(silent).request.model_copy(update={"agent": "oracle"}), settings=settings)
    assert first.reward == 0.5
    assert second.status is RolloutStatus.COMPLETED and second.reward == 0.0
    assert second.reward_note is not None and "no reward file" in second.reward_note


async def test_unisolated_sandbox_cannot_show_tests(tmp_path: Path, settings: Settings) -> None:
    unisolated = settings.model_copy(update={"backends": (LocalConfig(isolation="none", allow_unisolated=True),)})
    task = make_task(tmp_path, "t")
    result = await run_rollout(_load(task).request.model_copy(update={"agent": "oracle"}), settings=unisolated)
    assert result.status is RolloutStatus.INFRA_ERROR and result.reward is None
    assert result.error is not None and "/tests" in result.error
    assert not result.files.get("done.txt")  # refused before the agent ran


async def test_dockerfile_env_reaches_setup_agent_and_verify(tmp_path: Path, settings: Settings) -> None:
    """The Dockerfile's ENV holds for every command on the local backend, verify's clean context included."""
    task = make_task(
        tmp_path, "env", dockerfile="FROM x\nWORKDIR /workspace\nENV GREETING=hello TOOLS=/opt/none\n"
                                    "ENV PATH=$TOOLS/bin:$PATH\n",
        solve='echo "$GREETING" > done.txt; echo "$PATH" > path.txt',
        test_sh=f'mkdir -p /logs/verifier; [ "$(cat done.txt)" = hello ] && [ "$GREETING" = hello ] && '
                f'[ "${{PATH%%:*}}" = /opt/none/bin ] && echo 1 > {REWARD} || echo 0 > {REWARD}')
    result = await run_rollout(_load(task).request.model_copy(update={"agent": "oracle"}), settings=settings)
    assert result.status is RolloutStatus.COMPLETED and result.reward == 1.0, (result.error, result.verify_results)
    assert result.files["path.txt"].startswith("/opt/none/bin:/usr/local/sbin:")
