"""`coding-agent-env run` tells the truth: the exit status (1 when a task was refused or failed to load, said on
the last line; 0 when everything ran, whatever the rewards), the end summary's list of what did not pass (status
and first reason, bounded), and the journal's default place under STATE_DIR. The real CLI, in a process of its
own, on the local backend, with the oracle."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coding_agent_env.settings import Settings
from tests.tasks.harbor_fixtures import make_task

pytestmark = pytest.mark.usefixtures("assert_no_leftovers")


@pytest.fixture
def env(settings: Settings) -> Iterator[dict[str, str]]:
    """The test's settings as the CLI reads them: its own state dir and sandbox uid range. The default journals
    (`STATE_DIR/runs`) are removed after the test, before its state dir is checked for leftovers."""
    local: Any = settings.backends[0]
    yield {**os.environ, "STATE_DIR": str(settings.state_dir),
           "SANDBOX_UID_BASE": str(local.uid_base), "SANDBOX_UID_COUNT": str(local.uid_count)}
    shutil.rmtree(settings.state_dir / "runs", ignore_errors=True)


def _request(task_id: str, *, passes: bool = True, **more: Any) -> str:
    verify = ["test -f f"] if passes else ["false"]
    return json.dumps({"instruction": "x", "task_id": task_id, "solution": ["echo 1 > f"], "verify": verify, **more})


def _run(env: dict[str, str], *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "coding_agent_env.cli", "run", *args, "--agent", "oracle", "--no-progress"]
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


def _summary(stdout: str) -> list[str]:
    """The lines after the tables: the list of what did not pass, where the rollouts went, the exit line."""
    lines = stdout.splitlines()
    last_table = max(i for i, line in enumerate(lines) if line.startswith("└"))
    return lines[last_table + 1:]


def test_refused_and_unloadable_tasks_make_the_exit_status_1(tmp_path: Path, env: dict[str, str],
                                                                 settings: Settings) -> None:
    tasks = tmp_path / "tasks"
    make_task(tasks, "needs-docker", dockerfile="FROM x\nRUN pip install numpy\n")
    make_task(tasks, "bad-toml", toml="[agent")
    jsonl = tmp_path / "more.jsonl"
    jsonl.write_text("\n".join([_request("ok"), "nope", _request("zero", passes=False),
                                _request("huge", limits={"memory_mb": 10**9})]) + "\n")
    proc = _run(env, str(tasks), str(jsonl), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    summary = _summary(proc.stdout)
    assert summary[0] == "not passed: 5"
    listed = {line.split()[1].rstrip(":"): line.split()[0] for line in summary[1:6]}
    assert listed == {f"{tasks}/needs-docker": "refused", f"{tasks}/bad-toml": "load_error",
                      f"{jsonl}:2": "load_error", "zero": "failed", f"{jsonl}:4": "refused"}  # "ok" passed
    by_status = [line.split()[0] for line in summary[1:6]]
    # What never ran first, then the rollout that ran and scored 0.
    assert sorted(by_status[:4]) == ["load_error", "load_error", "refused", "refused"] and by_status[4] == "failed"
    text = "\n".join(summary)
    assert "needs-docker: its Dockerfile runs commands only Docker can run (RUN (line 2))" in text
    assert "bad-toml: malformed task.toml" in text
    assert f"{jsonl}:2: not JSON" in text
    assert f"{jsonl}:4: cannot run here: limits.memory_mb" in text and "SANDBOX_MEMORY_MB" in text
    assert "zero: reward 0.00" in text
    assert summary[-1] == "exit status 1: 2 refused and 2 failed to load (4 tasks never ran)"
    # The journal went under STATE_DIR, not the current directory, and the summary says where.
    written = list((settings.state_dir / "runs").glob("*.jsonl"))
    assert len(written) == 1 and [path.name for path in tmp_path.glob("*.jsonl")] == ["more.jsonl"]
    assert f"rollouts written to {written[0]}" in summary[-2]
    assert f"the results store {settings.state_dir / 'results.sqlite'}" in summary[-2]
    assert {json.loads(line)["task_id"] for line in written[0].read_text().splitlines()} == {"ok", "zero"}


def test_a_batch_that_ran_exits_0_whatever_its_rewards(tmp_path: Path, env: dict[str, str],
                                                        settings: Settings) -> None:
    jsonl = tmp_path / "tasks.jsonl"
    jsonl.write_text("\n".join([_request("ok"), _request("zero", passes=False)]) + "\n")
    proc = _run(env, str(jsonl), "--no-store", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = _summary(proc.stdout)
    assert summary[0] == "not passed: 1"
    assert summary[1].split() == ["failed", "zero:", "reward", "0.00:", "the", "tests", "did", "not", "pass"]
    (written,) = (settings.state_dir / "runs").glob("*.jsonl")
    assert summary[-1] == f"rollouts written to {written}"  # no store, no exit line
    assert not any("exit status" in line for line in proc.stdout.splitlines() + proc.stderr.splitlines())
    # Every run gets its own default journal; an explicit --out is used as given (and resumed).
    again = _run(env, str(jsonl), "--no-store", cwd=tmp_path)
    assert again.returncode == 0 and len(list((settings.state_dir / "runs").glob("*.jsonl"))) == 2
    out = tmp_path / "mine.jsonl"
    assert _run(env, str(jsonl), "--no-store", "--out", str(out), cwd=tmp_path).returncode == 0
    resumed = _run(env, str(jsonl), "--no-store", "--out", str(out), cwd=tmp_path)
    assert resumed.returncode == 0 and len(out.read_text().splitlines()) == 2
    assert f"rollouts written to {out}" in resumed.stdout


def test_the_list_is_bounded_and_the_worst_come_first(tmp_path: Path, env: dict[str, str]) -> None:
    jsonl = tmp_path / "tasks.jsonl"
    lines = [_request(f"zero{i:02d}", passes=False) for i in range(23)] + ["nope", _request("ok")]
    jsonl.write_text("\n".join(lines) + "\n")
    proc = _run(env, str(jsonl), "--no-store", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    summary = _summary(proc.stdout)
    assert summary[0] == "not passed: 24"
    assert summary[1].split()[:2] == ["load_error", f"{jsonl}:24:"]  # listed first though it came last
    assert [line.split()[0] for line in summary[2:21]] == ["failed"] * 19
    assert summary[21] == "  ... and 4 more"
    assert summary[-1] == "exit status 1: 1 failed to load (1 task never ran)"


def test_a_malformed_image_map_is_bad_usage(tmp_path: Path, env: dict[str, str]) -> None:
    jsonl = tmp_path / "tasks.jsonl"
    jsonl.write_text(_request("ok") + "\n")
    proc = _run(env, str(jsonl), "--no-store", "--image-map", "python", cwd=tmp_path)
    assert proc.returncode == 2 and "--image-map: image map entry 'python' is not FROM=TO" in proc.stderr
    for flags, said in ((("--top-logprobs", "21"), "--top-logprobs must be between 0 and 20"),
                        (("--max-tokens-cap", "-1"), "--max-tokens-cap must be 0"),
                        (("--mode", "white_box"), "invalid choice")):
        proc = _run(env, str(jsonl), "--no-store", *flags, cwd=tmp_path)
        assert proc.returncode == 2 and said in proc.stderr, proc.stderr
    bad_env = {**env, "IMAGE_MAP": "a=b,c"}
    proc = _run(bad_env, str(jsonl), "--no-store", cwd=tmp_path)
    assert proc.returncode == 2 and "IMAGE_MAP" in proc.stderr


def test_reasons_are_bounded_and_redacted(tmp_path: Path, env: dict[str, str]) -> None:
    key = "sk-run-report-SECRET-1234"
    tasks = tmp_path / f"tasks-{key}.jsonl"  # a source naming the key: its refusal is printed without it
    long_id = "long-" + "x" * 300 + "-end"
    tasks.write_text("nope\n" + _request(long_id, passes=False) + "\n")
    proc = _run({**env, "CAE_TEST_KEY": key}, str(tasks), "--no-store", "--base-url", "http://127.0.0.1:9/v1",
                "--api-key-env", "CAE_TEST_KEY", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    both = proc.stdout + proc.stderr
    assert key not in both, both[max(both.find(key) - 300, 0):both.find(key) + 50]
    assert "tasks-[REDACTED].jsonl:1: not JSON" in proc.stdout
    assert "bad task: " in proc.stderr and "tasks-[REDACTED].jsonl:1" in proc.stderr
    summary = _summary(proc.stdout)
    assert summary[2].split()[:2] == ["failed", "..." + long_id[-97:] + ":"]  # a long name keeps its end


def test_a_task_the_backend_cannot_honour_is_refused_in_full_and_the_run_exits_1(
        tmp_path: Path, env: dict[str, str], settings: Settings) -> None:
    """A Harbor task whose hidden tests go to /tests, where the sandbox cannot show /tests (commands unisolated, as on
    an unprivileged host): the backend refuses it at provisioning, naming `tests`; the run counts it as refused (not
    as an infra error of a rollout), lists the whole reason, and exits 1. A task the backend can run still runs."""
    tasks = tmp_path / "tasks"
    make_task(tasks, "hidden-tests")
    jsonl = tmp_path / "plain.jsonl"
    jsonl.write_text(_request("plain") + "\n")
    unisolated = {**env, "LOCAL_ISOLATION": "none", "SANDBOX_ALLOW_UNISOLATED": "true"}
    proc = _run(unisolated, str(tasks), str(jsonl), "--no-store", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    summary = _summary(proc.stdout)
    assert summary[0] == "not passed: 1", summary
    status, name = summary[1].split()[:2]
    assert status == "refused" and name.endswith("/hidden-tests:"), summary[1]
    assert "cannot honour the task's tests" in summary[1] and "/tests" in summary[1]
    assert not summary[1].endswith("...")  # the whole reason, not cut mid-sentence
    assert summary[-1] == "exit status 1: 1 refused (1 task never ran)"
    (written,) = (settings.state_dir / "runs").glob("*.jsonl")
    assert [json.loads(line)["task_id"] for line in written.read_text().splitlines()] == ["plain"]
