"""Hardened verify keeps the rewards of natural tasks (issue 42 item 1): every bundled Harbor task and a fixture
of a public Harbor task's shape (depgraph-topo-repair: `python3 /app/runtime/run_resolver.py` importing
`source_registry` beside it, which scored 0 for its reference solution under the safe path alone) pass with the
oracle and score 0 with `nop`, through `coding-agent-env run` on the local backend (bubblewrap) and on Docker
(each task's image built from its Dockerfile, its base mapped to the suite's offline image)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from coding_agent_env.cli.main import main
from coding_agent_env.settings import Settings
from tests.backends.conftest import docker_engine, no_leftover_containers  # noqa: F401 (fixtures)
from tests.backends.rootfs import IMAGE
from tests.runs.test_docker_batch import built_images, docker_env  # noqa: F401 (fixtures)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "runtime-sibling"
TASKS = sorted([*EXAMPLES.iterdir(), FIXTURE])

pytestmark = pytest.mark.usefixtures("assert_no_leftovers")


def run(tmp_path: Path, agent: str, tasks: list[Path], *where: str) -> dict[str, dict[str, Any]]:
    out = tmp_path / f"{agent}.jsonl"
    code = main(["run", *map(str, tasks), "--agent", agent, "-n", "2", *where, "--out", str(out),
                 "--no-store", "--no-progress"])
    found = {json.loads(line)["task_id"]: json.loads(line)["result"] for line in out.read_text().splitlines()}
    assert code == 0 and sorted(found) == sorted(task.name for task in tasks), (code, found)
    return found


@pytest.mark.parametrize(("agent", "reward"), [("oracle", 1.0), ("nop", 0.0)])
def test_every_bundled_task_and_the_runtime_fixture_keep_their_rewards(
    tmp_path: Path, settings: Settings, monkeypatch: pytest.MonkeyPatch, agent: str, reward: float
) -> None:
    monkeypatch.setenv("STATE_DIR", str(settings.state_dir))
    for name, result in run(tmp_path, agent, TASKS, "--sandbox", "local").items():
        assert (result["status"], result["reward"]) == ("completed", reward), (
            name, result["error"], result["reward_note"], result["verify_results"])


@pytest.mark.usefixtures("built_images", "no_leftover_containers")
@pytest.mark.parametrize(("agent", "reward"), [("oracle", 1.0), ("nop", 0.0)])
def test_every_bundled_task_and_the_runtime_fixture_keep_their_rewards_on_docker(
    tmp_path: Path, docker_env: dict[str, str], agent: str, reward: float
) -> None:
    mapped = ("--sandbox", "docker", "--image-map", f"python:3.12-slim-bookworm={IMAGE}")
    for name, result in run(tmp_path, agent, TASKS, *mapped).items():
        assert (result["status"], result["reward"]) == ("completed", reward), (
            name, result["error"], result["reward_note"], result["verify_results"])
