"""A batch writes a line for every rollout whatever goes wrong inside one (issue 27): hostile tasks are scored, a
rollout that raises becomes its own infra_error line and the others go on, and `coding-agent-env rollout` prints
a result where it used to print a traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from coding_agent_env.cli.main import main
from coding_agent_env.models import RolloutRequest, RolloutResult, RolloutStatus
from coding_agent_env.runs.batch import BatchPlan, Job, run_batch
from coding_agent_env.runs.executor import Executor
from coding_agent_env.runs.journal import Journal, Record
from coding_agent_env.settings import Settings
from coding_agent_env.tasks import LoadedTask, TaskError
from tests.tasks.harbor_fixtures import make_task

DEEP_JSON_REWARD = "mkdir -p /logs/verifier; head -c 4096 /dev/zero | tr '\\0' '[' > /logs/verifier/reward.json"
"""A verifier (as one running the agent's code could) leaving 4 KB of `[` as Harbor's reward.json."""
DEEP_TESTS_TREE = ("mkdir -p /logs/tests && cd /logs/tests && "
                   "python3 -c 'import os\nfor _ in range(3000): os.mkdir(\"d\"); os.chdir(\"d\")'")
"""An agent leaving a tree deeper than any recursion limit where verify makes /tests afresh (python, not a loop
of `mkdir`: each process started 3000 directories deep costs the kernel dearly, minutes in all)."""


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def env(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """The test's settings as the CLI reads them (its own state dir and sandbox uid range)."""
    local = settings.backends[0]
    monkeypatch.setenv("STATE_DIR", str(settings.state_dir))
    monkeypatch.setenv("SANDBOX_UID_BASE", str(local.uid_base))  # type: ignore[union-attr]
    monkeypatch.setenv("SANDBOX_UID_COUNT", str(local.uid_count))  # type: ignore[union-attr]


@pytest.mark.usefixtures("assert_no_leftovers")
def test_a_batch_with_hostile_tasks_writes_and_scores_every_line(
    tmp_path: Path, env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    tasks = tmp_path / "tasks"
    make_task(tasks, "deep-json-reward", test_sh=DEEP_JSON_REWARD)
    make_task(tasks, "deep-tests-tree", solve=DEEP_TESTS_TREE, test_sh="true")
    make_task(tasks, "normal")
    out = tmp_path / "out.jsonl"
    code = main(["run", str(tasks), "--agent", "oracle", "--sandbox", "local", "-n", "2", "--out", str(out),
                 "--no-progress", "--no-store"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    records = {rec["task_id"]: rec["result"] for rec in lines(out)}
    assert set(records) == {"deep-json-reward", "deep-tests-tree", "normal"}, captured.err
    assert records["normal"]["status"] == "completed" and records["normal"]["reward"] == 1.0
    for name in ("deep-json-reward", "deep-tests-tree"):
        result = records[name]
        summary = {key: result[key] for key in ("status", "reward", "reward_note", "error")}
        assert result["status"] == "completed" and result["reward"] == 0.0 and result["reward_note"], summary
    assert "nested deeper" in records["deep-json-reward"]["reward_note"]
    assert "Traceback" not in captured.err


def test_a_rollout_that_prints_a_result_not_a_traceback(
    tmp_path: Path, env: None, capsys: pytest.CaptureFixture[str], assert_no_leftovers: None
) -> None:
    task = tmp_path / "task.yaml"
    task.write_text(yaml.safe_dump({
        "task_id": "deep-json", "instruction": "x", "agent": "oracle", "sandbox": "local", "solution": ["true"],
        "verify": [DEEP_JSON_REWARD.replace("/logs/verifier/reward.json", '"$(dirname "$REWARD_FILE")/reward.json"')],
        "reward_file_required": True,
    }))
    assert main(["rollout", str(task), "--json"]) == 0
    result = RolloutResult.model_validate_json(capsys.readouterr().out)
    assert (result.status, result.reward) == (RolloutStatus.COMPLETED, 0.0)
    assert result.reward_note is not None and "reward.json ignored: nested deeper" in result.reward_note


# -- a rollout that raises --------------------------------------------------------------------------------------


class Raising(Executor):
    """Runs nothing: a result for each task, except that `raising` names tasks whose rollout raises instead (as a
    failure of ours inside one rollout would)."""

    def __init__(self, raising: dict[str, BaseException]) -> None:
        self.raising = raising

    async def run(self, task: LoadedTask, request: RolloutRequest, worker: int) -> RolloutResult:
        if task.task_id in self.raising:
            raise self.raising[task.task_id]
        return RolloutResult(rollout_id=f"r-{task.task_id}", task_id=task.task_id, agent="oracle", sandbox="local",
                             status=RolloutStatus.COMPLETED, reward=1.0)


class Observed:
    def __init__(self) -> None:
        self.records: list[Record] = []

    def started(self, job: Job) -> None: ...
    def skipped(self, record: Record) -> None: ...
    def problem(self, error: TaskError) -> None: ...
    def refused(self, job: Job, error: TaskError) -> None: ...

    def finished(self, record: Record) -> None:
        self.records.append(record)


class BrokenSink:
    """A results store that fails on every record."""

    def add(self, record: Record) -> None:
        raise OSError("database is locked")


def _task(task_id: str, key: str | None = None) -> LoadedTask:
    request = RolloutRequest(instruction="x", task_id=task_id, agent="oracle", api_key=key)
    return LoadedTask(request=request, source=f"{task_id}.yaml")


async def test_a_rollout_that_raises_is_its_own_infra_error_line_and_the_others_go_on(tmp_path: Path) -> None:
    secret = "sk-secret-value-in-a-message"
    tasks = [_task("before"), _task("recursion"), _task("leaky", secret), _task("after")]
    raising = {"recursion": RecursionError("maximum recursion depth exceeded"),
               "leaky": ValueError(f"upstream said no to {secret}")}
    observer = Observed()
    journal = Journal(tmp_path / "out.jsonl")
    summary = await run_batch(tasks, BatchPlan(attempts=2, concurrency=2), Raising(raising), journal, observer,
                              [BrokenSink()])
    records = [Record.from_json(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert sorted(record.key for record in records) == sorted((t.task_id, a) for t in tasks for a in (1, 2))
    assert len(observer.records) == 8 and summary.statuses == {"completed": 4, "infra_error": 4}
    by_task = {record.task_id: record.result for record in records}
    failed = by_task["recursion"]
    assert (failed.status, failed.reward, failed.task_id) == (RolloutStatus.INFRA_ERROR, None, "recursion")
    assert failed.error_detail is not None and failed.error_detail.type == "RecursionError"
    assert failed.error == "RecursionError in rollout: maximum recursion depth exceeded"
    leaky = by_task["leaky"]
    assert leaky.error_detail is not None and leaky.error_detail.type == "ValueError"
    assert secret not in (tmp_path / "out.jsonl").read_text()
    assert by_task["after"].status is RolloutStatus.COMPLETED and by_task["after"].reward == 1.0
