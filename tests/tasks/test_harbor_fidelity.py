"""Harbor tasks run as Harbor runs them (issue 29), end to end through `coding-agent-env run`: the bundled tasks
that each exercise one declaration (a `/app` workdir with a COPY outside it, a `solve.sh` using `/solution`
helpers, a verifier that drops to `nobody`, a multi-metric `reward.json`, a two-step task with a gate) pass with
the oracle and score 0 with `nop`, on the local backend (bubblewrap) and on Docker (the image built from each
task's Dockerfile, its base mapped to the suite's offline image)."""

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
FEATURES = ("app-workdir", "solution-helpers", "verifier-drops-user", "multi-metric", "two-step")

pytestmark = pytest.mark.usefixtures("assert_no_leftovers")


def results(out: Path) -> dict[str, dict[str, Any]]:
    return {json.loads(line)["task_id"]: json.loads(line)["result"] for line in out.read_text().splitlines()}


def run(tmp_path: Path, agent: str, *extra: str) -> dict[str, dict[str, Any]]:
    out = tmp_path / f"{agent}.jsonl"
    code = main(["run", *(str(EXAMPLES / name) for name in FEATURES), "--agent", agent, "-n", "2",
                 "--out", str(out), "--no-store", "--no-progress", *extra])
    found = results(out)
    assert code == 0 and sorted(found) == sorted(FEATURES), (code, found)
    return found


def check_oracle(found: dict[str, dict[str, Any]]) -> None:
    for name, result in found.items():
        assert (result["status"], result["reward"]) == ("completed", 1.0), (
            name, result["error"], result["reward_note"], result["verify_results"], result["agent_log_tail"])
    assert found["multi-metric"]["rewards"] == {"correctness": 1.0, "documentation": 1.0}
    steps = found["two-step"]["steps"]
    assert [(step["name"], step["reward"], step["gate"]) for step in steps] == [("write", 1.0, None),
                                                                                 ("extend", 1.0, None)]


def check_nop(found: dict[str, dict[str, Any]]) -> None:
    for name, result in found.items():
        assert (result["status"], result["reward"]) == ("completed", 0.0), (name, result["error"],
                                                                            result["verify_results"])
    assert found["multi-metric"]["rewards"] == {"correctness": 0.0, "documentation": 0.0}
    (first,) = found["two-step"]["steps"]  # the gate ended the task after its first step
    assert first["name"] == "write" and "min_reward" in first["gate"]


def test_the_feature_tasks_pass_with_the_oracle_and_fail_with_nop_on_local(tmp_path: Path, settings: Settings,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATE_DIR", str(settings.state_dir))
    check_oracle(run(tmp_path, "oracle", "--sandbox", "local"))
    check_nop(run(tmp_path, "nop", "--sandbox", "local"))


@pytest.mark.usefixtures("built_images", "no_leftover_containers")
def test_the_feature_tasks_pass_with_the_oracle_and_fail_with_nop_on_docker(
    tmp_path: Path, docker_env: dict[str, str]
) -> None:
    """Each task's image is built from its Dockerfile, its `python:3.12-slim-bookworm` base mapped to the suite's
    offline image (`--image-map`): the workdir, `/solution`, the users and the steps come from the container."""
    mapped = ("--sandbox", "docker", "--image-map", f"python:3.12-slim-bookworm={IMAGE}")
    check_oracle(run(tmp_path, "oracle", *mapped))
    check_nop(run(tmp_path, "nop", *mapped))
