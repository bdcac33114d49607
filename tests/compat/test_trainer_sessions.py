"""Loop-owning sessions where trainers are: a virtualenv with openenv 0.10.0 and this package without its server
extra (pip resolves them together: openenv pins mcp below 2), driving rollouts on a live server.

The driver (trainer_driver.py) runs in that virtualenv and checks our sessions against openenv's own
`LoopOwningSession` / `TrainableSession` protocols and `TrainingTrace` model. OpenCode runs against the scripted
fake LLM (tests/fakes/llm.py, in this process; no real model runs here), which picks each reply by the
conversation's turn, so a group of concurrent rollouts each get the whole script. TRL itself is not installed:
it needs torch, which this CPU-only CI does not carry.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coding_agent_env.agents.install import status
from coding_agent_env.agents.registry import cli_specs
from coding_agent_env.settings import Settings
from tests.agents.sessions import CORRECT, TASK, VERIFY, session, write_file_command
from tests.compat.conftest import launch_server
from tests.fakes.llm import FakeLLM, FakeLLMServer, Reply

DRIVER = Path(__file__).with_name("trainer_driver.py")
KEY = "sk-trainer-SECRET-0123456789"


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(FakeLLM(api_key=KEY, by_conversation=True)) as server:
        yield server


@pytest.fixture(scope="module")
def server(fake: FakeLLMServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with launch_server(tmp_path_factory.mktemp("trainer")) as url:
        yield url


def drive(python: Path, mode: str, *args: str) -> dict[str, Any]:
    done = subprocess.run([str(python), str(DRIVER), mode, *args], capture_output=True, text=True, timeout=900,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def defaults(fake: FakeLLMServer) -> dict[str, Any]:
    return {"agent": "opencode", "base_url": fake.base_url, "api_key": KEY, "model": "fake/coder-1",
            "mode": "transparent_proxy", "top_logprobs": 1, "agent_timeout_s": 120}


def require_opencode() -> None:
    agents_dir = Settings().agents_dir
    if not all(status(spec, agents_dir).installed for spec in cli_specs() if spec.name == "opencode"):
        pytest.skip("opencode is not installed (coding-agent-env agents install)")


def test_installs_and_imports_beside_openenv(trainer_venv: Path) -> None:
    out = drive(trainer_venv, "imports")
    assert out["server_only"] == [] and int(out["mcp"].split(".")[0]) < 2


def test_a_group_of_rollouts_through_loop_owning_sessions(trainer_venv: Path, server: str,
                                                          fake: FakeLLMServer) -> None:
    require_opencode()
    fake.app.reset(session("opencode", write_file_command("binary_search.py", CORRECT), "ls"))
    args = {"defaults": defaults(fake), "task": {"instruction": TASK, "verify": VERIFY}, "k": 3}
    out = drive(trainer_venv, "group", server, json.dumps(args))
    assert out["loop_owning"] is True and out["trainable"] is True
    assert [r["seed"] for r in out["rollouts"]] == [0, 1, 2]
    for rollout in out["rollouts"]:
        assert (rollout["exit_code"], rollout["reward"]) == (0, 1.0), rollout
        assert rollout["entries"] == rollout["trace_turns"] >= 3 and rollout["round_trip"] is True
        assert rollout["trainable_tokens"] > 0 and len(set(rollout["node_ids"])) == rollout["entries"]
        assert {"request", "response", "prompt_token_ids", "completion_token_ids", "per_token_logps", "loss_mask",
                "reward", "metadata"} <= set(rollout["entry_keys"])
    assert len({tuple(r["node_ids"]) for r in out["rollouts"]}) == 3  # three rollouts, three sets of ids


def test_close_cancels_a_live_rollout(trainer_venv: Path, server: str, fake: FakeLLMServer) -> None:
    require_opencode()
    fake.app.reset([Reply(hang=True)])
    args = {"defaults": defaults(fake), "task": {"instruction": TASK, "verify": VERIFY}, "wait_s": 5}
    out = drive(trainer_venv, "close", server, json.dumps(args))
    assert out["timed_out"] is True and out["done"] is True and "cancelled" in out["failure"]


def test_the_grpo_example_runs_a_group(server: str, fake: FakeLLMServer, tmp_path: Path) -> None:
    require_opencode()
    fake.app.reset(session("opencode", write_file_command("binary_search.py", CORRECT), "ls"))
    task = tmp_path / "task.json"
    task.write_text(json.dumps({"instruction": TASK, "verify": VERIFY}))
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, str(root / "examples" / "grpo_group.py"), str(task), "--server", server, "--base-url",
         fake.base_url, "--model", "fake/coder-1", "--k", "3"],
        capture_output=True, text=True, timeout=900, check=False, cwd=root,
        env={**os.environ, "LLM_API_KEY": KEY},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(r["status"], r["reward"], r["advantage"]) for r in rows] == [("completed", 1.0, 0.0)] * 3
    assert all(r["sequences"] >= 1 and r["trainable_tokens"] > 0 for r in rows)
    assert KEY not in done.stdout + done.stderr
