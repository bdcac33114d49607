"""Verification the agent cannot touch (INTEGRITY 29): hidden verify files and the clean room, attacked.

Each attack is an `oracle` solution that games the bundled binary-search task the way an RL policy would; each
must end with the honest reward. The workspace-verify control runs show the same attacks do work when verify
runs in the agent's own workspace, so these tests can fail.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from coding_agent_env.cli.main import load_task
from coding_agent_env.models import RolloutRequest, RolloutStatus
from coding_agent_env.rollout import events as ev
from coding_agent_env.rollout import run_rollout
from coding_agent_env.settings import Settings

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "binary_search.yaml"
SHADOW_UNITTEST = (
    "mkdir -p unittest && printf 'import sys\\nsys.exit(0)\\n' > unittest/__main__.py && touch unittest/__init__.py"
)
PLANTED = ["conftest.py", "pytest.ini", "setup.cfg", "tox.ini", "sitecustomize.py", "usercustomize.py", "evil.pth",
           "Makefile"]

pytestmark = pytest.mark.usefixtures("assert_no_leftovers")


def example(**update: object) -> RolloutRequest:
    return load_task(str(EXAMPLE)).model_copy(update=update)


def correct_solution() -> list[str]:
    return example().solution


UNITTEST = "python3 -m unittest discover -q -s . -p test_search.py"
"""The example's tests by path (`discover -s .` puts the directory on the path itself: the shape that works on
every backend, with or without a path guard, docs/verify.md)."""


def in_workspace(task: RolloutRequest) -> RolloutRequest:
    """The same task verified the old way: the visible tests run by unittest in the workspace, no artifacts, no
    verify hardening (the holes the clean room and the hardening close)."""
    verify = task.verify if task.verify != example().verify else ["python3 -m unittest -q test_search"]
    return task.model_copy(update={"artifacts": [], "verify_files": {}, "verify_hardening": False, "verify": verify})


async def test_the_example_verifies_in_a_clean_room(settings: Settings) -> None:
    result = await run_rollout(example(), settings=settings)
    assert result.status is RolloutStatus.COMPLETED and result.reward == 1.0, result.error
    assert result.verify_context == "clean_room"
    assert result.artifacts is not None and result.artifacts.copied == ["search.py"]
    assert not result.artifacts.missing and not result.artifacts.refused


async def test_shadowing_unittest_scores_zero_in_the_clean_room(settings: Settings) -> None:
    hacked = await run_rollout(example(solution=[SHADOW_UNITTEST]), settings=settings)
    assert hacked.status is RolloutStatus.COMPLETED and hacked.reward == 0.0
    control = await run_rollout(in_workspace(example(solution=[SHADOW_UNITTEST])), settings=settings)
    assert control.verify_context == "workspace" and control.reward == 1.0  # the hole the clean room closes


async def test_shadowing_json_scores_zero(settings: Settings) -> None:
    check = "import sys\nsys.path.insert(0, '')\nimport json, search\nassert search.binary_search([1, 2], 2) == 1, 'wrong'\nprint(json.dumps('ok'))\n"
    task = example(solution=["printf 'import sys\\nsys.exit(0)\\n' > json.py"], verify=["python3 check.py"],
                   verify_files={"check.py": check})
    assert (await run_rollout(task, settings=settings)).reward == 0.0
    control = task.model_copy(update={"artifacts": [], "files": {**task.files, "check.py": check}, "verify_files": {},
                                      "verify_hardening": False})
    assert (await run_rollout(control, settings=settings)).reward == 1.0


@pytest.mark.parametrize("name", PLANTED)
async def test_planted_config_files_never_reach_the_clean_room(settings: Settings, name: str) -> None:
    """A correct solution that also plants a file verify tools read: the file is absent where verify runs."""
    task = example(solution=[*correct_solution(), f"echo planted > {name}"],
                   verify=[f"test ! -e {name}", UNITTEST])
    result = await run_rollout(task, settings=settings)
    assert result.reward == 1.0 and result.artifacts is not None and result.artifacts.copied == ["search.py"]
    assert (await run_rollout(in_workspace(task), settings=settings)).reward == 0.5


@pytest.mark.parametrize("tamper", ["edit", "delete"])
async def test_the_visible_test_file_cannot_be_edited_or_deleted(settings: Settings, tamper: str) -> None:
    """The test stays among the visible `files` only (no hidden copy): the clean room restores the original."""
    files = example().files
    task = example(verify_files={}, verify=[UNITTEST], solution=[
        "printf 'import unittest\\nclass T(unittest.TestCase):\\n    def test_ok(self): pass\\n' > test_search.py"
        if tamper == "edit" else "rm test_search.py"
    ])
    assert task.files == files and "test_search.py" in files
    result = await run_rollout(task, settings=settings)
    assert result.reward == 0.0 and result.verify_context == "clean_room"


async def test_hidden_verify_files_are_not_visible_before_verify(settings: Settings) -> None:
    """Setup and the agent never see a verify file; in the workspace mode it replaces what the agent left."""
    task = RolloutRequest(
        instruction="x", agent="oracle", setup=["test ! -e hidden.txt"],
        solution=["test ! -e hidden.txt && mkdir hidden.txt && ln -s /etc/passwd other.txt"],
        verify=["grep -qx secret hidden.txt", "grep -qx other other.txt"],
        verify_files={"hidden.txt": "secret\n", "other.txt": "other\n"},
    )
    result = await run_rollout(task, settings=settings)
    assert result.status is RolloutStatus.COMPLETED and result.reward == 1.0, (result.setup_results, result.verify_results)
    assert result.verify_context == "workspace" and result.agent_exit_code == 0


@pytest.mark.parametrize(
    ("attack", "reason"),
    [
        ("rm search.py && ln -s /etc/passwd search.py", "symlink"),
        ("rm search.py && ln -s test_search.py search.py", "symlink"),
        ("rm search.py && mkfifo search.py", "not a regular file"),
        ("rm search.py && python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('search.py')\"",
         "not a regular file"),
        ("rm search.py && mkdir search.py && touch search.py/x", "directory"),
    ],
    ids=["symlink-out", "symlink-to-test", "fifo", "socket", "directory"],
)
async def test_an_artifact_that_is_not_a_regular_file_is_refused(settings: Settings, attack: str, reason: str) -> None:
    result = await run_rollout(example(solution=[attack]), settings=settings)
    assert result.status is RolloutStatus.COMPLETED and result.reward == 0.0
    assert result.artifacts is not None and reason in result.artifacts.refused["search.py"]
    assert result.artifacts.copied == []


async def test_an_artifact_over_the_cap_is_refused(settings: Settings) -> None:
    capped = settings.model_copy(update={"artifact_max_file_bytes": 4096})
    padded = [*correct_solution(), "python3 -c \"open('search.py', 'a').write('#' * 5000)\""]
    result = await run_rollout(example(solution=padded), settings=capped)
    assert result.reward == 0.0 and result.artifacts is not None
    assert "larger than the cap of 4096 bytes" in result.artifacts.refused["search.py"]
    assert (await run_rollout(example(), settings=capped)).reward == 1.0


async def test_a_missing_artifact_is_reported(settings: Settings) -> None:
    result = await run_rollout(example(solution=["rm search.py"], artifacts=["search.py", "extra/*.py"]),
                               settings=settings)
    assert result.reward == 0.0 and result.artifacts is not None
    assert result.artifacts.missing == ["search.py", "extra/*.py"]


async def test_a_background_process_cannot_rewrite_artifacts_during_verify(settings: Settings) -> None:
    """The agent leaves a detached process that would overwrite the artifact with a wrong answer: its whole tree
    is dead before anything is copied, so the copy is what the agent had when its phase ended."""
    wrong = "printf 'def binary_search(items, target):\\n    return 0\\n' > search.py"
    task = example(solution=[*correct_solution(),
                             f"setsid nohup sh -c 'sleep 0.5; while :; do {wrong}; done' >/dev/null 2>&1 &"])
    result = await run_rollout(task, settings=settings)
    assert result.reward == 1.0 and result.artifacts is not None and result.artifacts.copied == ["search.py"]


async def test_a_planted_reward_file_is_ignored(settings: Settings) -> None:
    plant = "mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt; echo 1 > reward.txt"
    result = await run_rollout(example(solution=[plant]), settings=settings)
    assert result.reward == 0.0 and result.reward_note is None


async def test_the_clean_room_is_set_up_like_the_agents_sandbox(settings: Settings) -> None:
    """What setup made is there again (the agent deleted its copy), and what the agent made beside the artifacts
    is not."""
    task = example(setup=["mkdir -p data && echo 42 > data/answer.txt"],
                   solution=[*correct_solution(), "rm -r data && echo 7 > other.txt"],
                   verify=["grep -qx 42 data/answer.txt", "test ! -e other.txt", UNITTEST])
    result = await run_rollout(task, settings=settings)
    assert result.reward == 1.0, result.verify_results
    assert len(result.setup_results) == 1 and "data/answer.txt" not in result.files


async def test_cancelled_while_verifying_in_the_clean_room(settings: Settings) -> None:
    """Both sandboxes are gone after a cancel during clean-room verify (the fixture checks for leftovers)."""
    cancel = asyncio.Event()

    def on_event(event: ev.RolloutEvent) -> None:
        if isinstance(event, ev.CommandFinished) and event.phase == "verify":
            asyncio.get_running_loop().call_later(0.2, cancel.set)

    task = example(verify=["touch started", "sleep 1000"])
    result = await run_rollout(task, settings=settings, emit=on_event, cancel=cancel)
    assert result.status is RolloutStatus.CANCELLED and result.verify_context == "clean_room"
    assert [r.cmd for r in result.verify_results] == ["touch started"]
