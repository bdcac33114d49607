"""`coding-agent-env run`: the example task set and Harbor tasks, oracle and an LLM agent (fake LLM), local and
Docker, in-process and through a server; resuming after an interruption."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from coding_agent_env.cli.main import main
from coding_agent_env.settings import Settings
from tests.helpers import serving, wait_until
from tests.tasks.harbor_fixtures import REWARD, make_task

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"
NAMES = sorted(path.name for path in EXAMPLES.iterdir() if (path / "task.toml").is_file())
"""The bundled tasks (nine: the feature tasks among them)."""
pytestmark = pytest.mark.usefixtures("assert_no_leftovers")


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def env(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The test's settings as the CLI reads them (its own state dir and sandbox uid range)."""
    local = settings.backends[0]
    values = {"STATE_DIR": str(settings.state_dir), "SANDBOX_UID_BASE": str(local.uid_base),  # type: ignore[union-attr]
              "SANDBOX_UID_COUNT": str(local.uid_count)}  # type: ignore[union-attr]
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    return values


def test_examples_with_the_oracle_and_resume(tmp_path: Path, env: dict[str, str],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.jsonl"
    assert main(["run", str(EXAMPLES), "--agent", "oracle", "-k", "2", "-n", "3", "--out", str(out)]) == 0
    first = lines(out)
    assert len(first) == 2 * len(NAMES) and all(rec["result"]["reward"] == 1.0 for rec in first), first
    assert {(rec["task_id"], rec["attempt"]) for rec in first} == {(t, a) for t in NAMES for a in (1, 2)}
    printed = capsys.readouterr().out
    assert "pass@2" in printed and "mean reward" in printed
    assert main(["run", str(EXAMPLES), "--agent", "oracle", "-k", "3", "--out", str(out)]) == 0
    second = lines(out)
    done = len(first)
    assert second[:done] == first and len(second) == 3 * len(NAMES) and {rec["attempt"] for rec in second[done:]} == {3}


def test_bad_entries_are_reported_and_the_rest_run(tmp_path: Path, env: dict[str, str],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    tasks = tmp_path / "tasks"
    make_task(tasks, "good")
    make_task(tasks, "needs-docker", dockerfile="FROM x\nRUN pip install numpy\n")
    make_task(tasks, "silent", test_sh="true")
    make_task(tasks, "bad-toml", toml="[agent")
    jsonl = tmp_path / "more.jsonl"
    good = {"instruction": "x", "task_id": "j1", "solution": ["echo 1 > f"], "verify": ["test -f f"]}
    too_big = {"instruction": "x", "task_id": "j3", "limits": {"memory_mb": 10**9}}
    jsonl.write_text(json.dumps(good) + "\nnope\n" + json.dumps(too_big) + "\n")
    out = tmp_path / "out.jsonl"
    assert main(["run", str(tasks), str(jsonl), "--agent", "oracle", "--out", str(out), "--no-progress"]) == 1
    records = {rec["task_id"]: rec for rec in lines(out)}
    assert set(records) == {"good", "silent", "j1"}
    assert records["good"]["result"]["reward"] == 1.0 and records["j1"]["result"]["reward"] == 1.0
    silent = records["silent"]["result"]
    assert silent["reward"] == 0.0 and "no reward file" in silent["reward_note"]
    captured = capsys.readouterr()
    err, table = captured.err, captured.out
    assert "unsupported" in err and "needs-docker" in err and "--sandbox docker" in err
    assert "bad-toml" in err and "malformed task.toml" in err and f"{jsonl}:2" in err
    assert f"{jsonl}:3: cannot run here" in err and "SANDBOX_MEMORY_MB" in err  # refused, not an agent's failure
    assert re.search(r"unsupported\s+│ 2 ", table) and re.search(r"load errors\s+│ 2 ", table)


def test_interrupted_run_resumes_without_redoing_or_losing(tmp_path: Path, env: dict[str, str]) -> None:
    tasks = tmp_path / "slow.jsonl"
    # Two quick tasks, then six that are surely still running when the interrupt comes (however fast the
    # machine starts sandboxes), so the interrupt always finds work under way.
    tasks.write_text("".join(json.dumps({"instruction": "wait", "task_id": f"t{i}",
                                         "solution": ["sleep 0.3" if i < 2 else "sleep 3"], "verify": ["true"]})
                             + "\n" for i in range(8)))
    out = tmp_path / "out.jsonl"
    argv = [sys.executable, "-m", "coding_agent_env.cli", "run", str(tasks), "--agent", "oracle", "--out", str(out),
            "--no-progress"]
    # SIGINT at its default in the child whatever this process inherited: a suite started in the background by a
    # non-interactive shell ignores it, and a Python started with it ignored never raises KeyboardInterrupt.
    proc = subprocess.Popen(argv, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:

        def journalled() -> bool:
            assert proc.poll() is None, proc.communicate()
            return out.exists() and len(out.read_text().splitlines()) >= 2

        wait_until(journalled, "two results in the journal", timeout_s=60)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "rerun to go on" in err
    before = lines(out)
    assert 2 <= len(before) < 8
    assert main(["run", str(tasks), "--agent", "oracle", "--out", str(out), "--no-progress"]) == 0
    after = lines(out)
    assert after[: len(before)] == before
    assert sorted(rec["task_id"] for rec in after) == sorted(f"t{i}" for i in range(8))


def _fake_llm_script(agent: str) -> list[Any]:
    from tests.agents.sessions import session, write_file_command

    return session(agent, write_file_command("hello.txt", "Hello, world!\n"))


@pytest.mark.parametrize("agent", ["terminus", "opencode"])
def test_an_llm_agent_against_the_fake_llm(agent: str, tmp_path: Path, env: dict[str, str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from coding_agent_env.agents.install import status
    from coding_agent_env.agents.registry import cli_specs
    from tests.fakes.llm import FakeLLM, FakeLLMServer

    specs = {spec.name: spec for spec in cli_specs()}
    if agent in specs and not status(specs[agent], Settings().agents_dir).installed:
        pytest.skip(f"{agent} is not installed (coding-agent-env agents install)")
    key = "sk-batch-SECRET-0123456789"
    monkeypatch.setenv("BATCH_TEST_KEY", key)
    out = tmp_path / "out.jsonl"
    with FakeLLMServer(FakeLLM(api_key=key)) as fake:
        fake.app.script = _fake_llm_script(agent)
        code = main(["run", str(EXAMPLES / "hello-file"), "--agent", agent, "--base-url", fake.base_url,
                     "--api-key-env", "BATCH_TEST_KEY", "--model", "fake/coder-1", "--out", str(out), "--no-progress",
                     "--mode", "transparent_proxy", "--top-logprobs", "2", "--max-tokens-cap", "64"])
        assert code == 0
        assert fake.app.requests  # the agent really called the LLM
        # The batch's mode reached the relay: it asked for logprobs, with the cap applied.
        sent = [seen.body for seen in fake.app.requests]
        assert all(body.get("logprobs") and body.get("top_logprobs") == 2 for body in sent), sent
        assert all(body.get("max_tokens", 0) <= 64 for body in sent)
    (record,) = lines(out)
    assert record["result"]["status"] == "completed", record["result"]["error"]
    assert record["result"]["reward"] == 1.0 and record["result"]["proxy_turns"]
    assert record["result"]["mode"] == "transparent_proxy"
    assert any(turn["completion_token_ids"] for turn in record["result"]["proxy_turns"])
    assert key not in out.read_text()
    # The hidden tests never reached the agent: not in what it was sent, not in its workspace.
    assert all("reward.txt" not in json.dumps(seen.body) for seen in fake.app.requests)


def test_through_a_running_server(tmp_path: Path, env: dict[str, str]) -> None:
    import socket

    import httpx

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "coding_agent_env.cli", "serve", "--port", str(port)],
                              env={**os.environ, **env, "ENABLE_WEB_INTERFACE": "false"},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(serving(f"http://127.0.0.1:{port}/health", server, timeout_s=1), "the server to come up",
                   timeout_s=60, interval_s=0.05)
        out = tmp_path / "out.jsonl"
        assert main(["run", str(EXAMPLES), "--agent", "oracle", "-n", "2", "--server", f"http://127.0.0.1:{port}",
                     "--out", str(out), "--no-progress"]) == 0
        records = lines(out)
        assert len(records) == len(NAMES) and all(rec["result"]["reward"] == 1.0 for rec in records), records
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def test_an_llm_agent_cannot_see_the_hidden_tests(tmp_path: Path, env: dict[str, str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.agents.sessions import session, write_file_command
    from tests.fakes.llm import FakeLLM, FakeLLMServer

    marker = "HIDDEN-EXPECTATION-5150"
    test_sh = (f"mkdir -p /logs/verifier; grep -q {marker} /tests/expected.txt && [ \"$(cat done.txt)\" = ok ] "
               f"&& echo 1 > {REWARD} || echo 0 > {REWARD}")
    task = make_task(tmp_path / "tasks", "peek", test_sh=test_sh, extra_tests={"expected.txt": marker})
    key = "sk-peek-SECRET-0123456789"
    monkeypatch.setenv("BATCH_TEST_KEY", key)
    out = tmp_path / "out.jsonl"
    look = "ls -la /tests/ /logs/ 2>&1; cat /tests/* /logs/tests/* 2>&1; grep -rs HIDDEN / --include=*.txt | head"
    with FakeLLMServer(FakeLLM(api_key=key)) as fake:
        fake.app.script = session("terminus", look, write_file_command("done.txt", "ok\n"))
        assert main(["run", str(task), "--agent", "terminus", "--base-url", fake.base_url, "--api-key-env",
                     "BATCH_TEST_KEY", "--model", "fake/coder-1", "--out", str(out), "--no-progress"]) == 0
        seen = json.dumps([request.body for request in fake.app.requests])
    (record,) = lines(out)
    assert record["result"]["reward"] == 1.0, record["result"]["error"]  # verify did see the tests
    assert "No such file" in seen  # the agent looked, and its output went back to the model
    assert marker not in seen and marker not in json.dumps(record["result"]["proxy_turns"])


def test_a_sampled_run_draws_its_rollouts_and_resumes(tmp_path: Path, env: dict[str, str],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """`run --sampler sequential --rollouts N`: N rollouts, each task in turn, each draw the task's next attempt;
    rerun with a larger N, it goes on from what the journal holds (which counts toward N). Bad combinations are
    usage errors."""
    jsonl = tmp_path / "set.jsonl"
    jsonl.write_text("".join(json.dumps({"instruction": f"t{i}", "solution": [f"touch t{i}"], "verify": [f"test -f t{i}"],
                                         "task_id": f"t{i}"}) + "\n" for i in range(3)))
    out = tmp_path / "out.jsonl"
    base = ["run", str(jsonl), "--agent", "oracle", "--out", str(out), "--no-progress"]
    assert main([*base, "--sampler", "sequential", "--rollouts", "4"]) == 0
    first = lines(out)
    assert [(rec["task_id"], rec["attempt"]) for rec in first] == [("t0", 1), ("t1", 1), ("t2", 1), ("t0", 2)]
    assert all(rec["result"]["reward"] == 1.0 for rec in first)
    assert main([*base, "--sampler", "curriculum", "--rollouts", "6", "-n", "2"]) == 0
    second = lines(out)
    assert second[:4] == first and len(second) == 6
    assert len({(rec["task_id"], rec["attempt"]) for rec in second}) == 6  # no (task, attempt) twice
    capsys.readouterr()
    assert main([*base, "--rollouts", "3"]) == 2
    assert main([*base, "--sampler", "uniform"]) == 2
    assert main([*base, "--sampler", "uniform", "--rollouts", "2", "-k", "2"]) == 2
    assert "--sampler" in capsys.readouterr().err
