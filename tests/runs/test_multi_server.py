"""`coding-agent-env run --server A --server B`: a batch spread across two real servers of ours (uvicorn in
threads, the local backend, the oracle agent), each server's own rollout counter (`/metrics`) agreeing with what
the run printed; an unreachable server said clearly while the other runs everything; no server at all, each
rollout an infrastructure error naming the server."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from coding_agent_env.cli.main import main
from coding_agent_env.settings import Settings
from tests.helpers import dead_url, rollouts_finished
from tests.protocol.live import LiveServer

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"
TASKS = len([path for path in EXAMPLES.iterdir() if (path / "task.toml").is_file()])
pytestmark = pytest.mark.usefixtures("assert_no_leftovers")


@pytest.fixture(autouse=True)
def env(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """The test's settings as the CLI reads them (its own state dir and sandbox uid range)."""
    local = settings.backends[0]
    monkeypatch.setenv("STATE_DIR", str(settings.state_dir))
    monkeypatch.setenv("SANDBOX_UID_BASE", str(local.uid_base))  # type: ignore[union-attr]
    monkeypatch.setenv("SANDBOX_UID_COUNT", str(local.uid_count))  # type: ignore[union-attr]


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]




def run(tmp_path: Path, *servers: str) -> tuple[int, list[dict[str, Any]]]:
    out = tmp_path / "out.jsonl"
    args = ["run", str(EXAMPLES), "--agent", "oracle", "-n", "4", "--out", str(out), "--no-store", "--no-progress"]
    for server in servers:
        args += ["--server", server]
    code = main(args)
    return code, records(out)


def test_a_batch_spreads_across_two_servers(make_live: Callable[..., LiveServer], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    first, second = make_live(), make_live()
    code, done = run(tmp_path, first.http, second.http)
    assert code == 0
    assert len(done) == TASKS and all(rec["result"]["reward"] == 1.0 for rec in done), done
    counts = rollouts_finished(first), rollouts_finished(second)
    assert sum(counts) == TASKS and min(counts) >= TASKS // 2 - 1, counts  # 4 workers: two on each server
    printed = capsys.readouterr().out
    assert f"rollouts per server: {first.http} {counts[0]}, {second.http} {counts[1]}" in printed


def test_an_unreachable_server_is_said_and_the_other_runs_the_batch(
        make_live: Callable[..., LiveServer], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    live, dead = make_live(), dead_url()
    code, done = run(tmp_path, f"{dead}, {live.http}")  # one comma-separated value
    assert code == 0
    assert len(done) == TASKS and all(rec["result"]["reward"] == 1.0 for rec in done), done
    assert rollouts_finished(live) == TASKS
    captured = capsys.readouterr()
    said = re.findall(rf"server {re.escape(dead)} is unreachable \(cannot connect: .+?\): its rollouts go to "
                      "the other servers", captured.err)
    assert len(said) == 1, captured.err  # said once, not once per rollout
    assert f"rollouts per server: {dead} 0 (unreachable), {live.http} {TASKS}" in captured.out


def test_with_no_server_reachable_each_rollout_fails_naming_the_servers(tmp_path: Path) -> None:
    dead, other = dead_url(), dead_url()
    code, done = run(tmp_path, dead, other)
    assert code == 0  # they ran, as infrastructure errors (the summary and the journal say so)
    assert len(done) == TASKS
    for rec in done:
        result = rec["result"]
        assert result["status"] == "infra_error" and result["reward"] is None
        assert result["error_detail"]["type"] == "ServerUnreachableError"
        assert f"server {dead}: cannot connect" in result["error"]
        assert f"server {other}: cannot connect" in result["error"]


def test_server_urls_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(EXAMPLES), "--server", " , ", "--out", str(tmp_path / "o.jsonl"), "--no-store"]) == 2
    assert "--server needs a URL" in capsys.readouterr().err


def test_tasks_a_server_cannot_honour_are_refused_and_the_run_exits_1(
        settings: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The bundled Harbor tasks against a server whose sandboxes cannot show /tests (its commands unisolated, as on
    an unprivileged host with no isolation tier): every one is refused naming `tests`, none is counted as a rollout
    or an infra error, and the run exits 1 (it exited 0 with nine infra errors)."""
    from coding_agent_env.settings import LocalConfig

    local = settings.backends[0]
    unisolated = LocalConfig(isolation="none", allow_unisolated=True, uid_base=local.uid_base,  # type: ignore[union-attr]
                             uid_count=local.uid_count)  # type: ignore[union-attr]
    server = LiveServer(Settings(state_dir=settings.state_dir, backends=(unisolated,))).start()
    try:
        code, done = run(tmp_path, server.http)
    finally:
        server.stop()
    printed = capsys.readouterr().out
    assert code == 1 and done == [], printed
    assert f"exit status 1: {TASKS} refused ({TASKS} tasks never ran)" in printed
    refused = [line for line in printed.splitlines() if line.strip().startswith("refused")]
    assert len(refused) == TASKS and all("cannot honour the task's tests" in line for line in refused), refused


def test_a_tasks_attempts_are_a_group_of_known_size_released_as_the_last_ends(
        make_live: Callable[..., LiveServer], tmp_path: Path) -> None:
    """`run --attempts N` makes a task's attempts one group of N members (`group_size`): its set-up template is
    released as the last attempt ends, not kept idle for GROUP_IDLE_S (10 minutes here) for members that cannot
    come. Read from the server's own gauge of templates held."""
    import httpx

    server = make_live(group_idle_s=600.0)
    task = {"instruction": "x", "task_id": "grouped", "setup": ["echo set > s"], "solution": ["cp s f"],
            "verify": ["grep -qx set f"]}
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(task) + "\n")
    out = tmp_path / "out.jsonl"
    code = main(["run", str(tasks), "--agent", "oracle", "--attempts", "3", "-n", "3", "--server", server.http,
                 "--out", str(out), "--no-store", "--no-progress"])
    done = records(out)
    assert code == 0 and [rec["result"]["reward"] for rec in done] == [1.0] * 3, done
    assert {rec["result"]["group"]["setup"] for rec in done} == {"forked"}, done
    gauge = [line for line in httpx.get(f"{server.http}/metrics", timeout=10).text.splitlines()
             if line.startswith("coding_agent_env_group_templates{")]
    assert gauge and all(float(line.rsplit(" ", 1)[1]) == 0 for line in gauge), gauge
