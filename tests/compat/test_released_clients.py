"""OpenEnv's released clients (openenv-core 0.3.0 = Gen A, openenv 0.10.0 = Gen B) against a live server."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.compat.conftest import launch_server

DRIVERS = Path(__file__).with_name("drivers.py")


def drive(python: Path, mode: str, url: str) -> dict[str, Any]:
    done = subprocess.run([str(python), str(DRIVERS), mode, url], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def check_mcp(out: dict[str, Any], episode_id: str, steps: int) -> None:
    assert out["names"] == ["run_rollout"]
    assert (out["reward"], out["status"]) == (1.0, "completed")
    assert (out["episode_id"], out["step_count"]) == (episode_id, steps)


def test_gen_a_mcp_tool_client_over_ws(gen_a: Path, live_url: str) -> None:
    check_mcp(drive(gen_a, "mcp-ws", live_url), "compat-1", 2)  # list_tools + call_tool are WS steps


def test_gen_a_generic_step_loop(gen_a: Path, live_url: str) -> None:
    out = drive(gen_a, "generic", live_url)
    assert out["names"] == ["run_rollout"] and (out["reward"], out["step_reward"]) == (1.0, 1.0)
    assert (out["episode_id"], out["step_count"], out["rollouts_completed"]) == ("compat-generic", 2, 1)


def test_gen_b_mcp_tool_client_session_attach(gen_b: Path, live_url: str) -> None:
    check_mcp(drive(gen_b, "mcp-production", live_url), "compat-1", 0)  # tools over HTTP /mcp


def test_gen_b_mcp_tool_client_async(gen_b: Path, live_url: str) -> None:
    check_mcp(drive(gen_b, "mcp-async", live_url), "compat-async", 0)


@pytest.mark.parametrize("mode", ["mcp-ws", "generic"])
def test_gen_b_ws_only_paths(gen_b: Path, live_url: str, mode: str) -> None:
    out = drive(gen_b, mode, live_url)
    assert out["reward"] == 1.0 and out["step_count"] == 2


def test_openenv_validate_url(gen_b: Path, live_url: str) -> None:
    openenv = gen_b.parent / "openenv"
    done = subprocess.run([str(openenv), "validate", "--url", live_url], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.mark.parametrize(("client", "mode"), [
    ("gen_a", "episode-mcp-ws"), ("gen_b", "episode-mcp-ws"), ("gen_b", "episode-mcp-production"),
])
def test_an_interactive_episode_through_mcp_tool_client(request: pytest.FixtureRequest, live_url: str,
                                                         client: str, mode: str) -> None:
    out = drive(request.getfixturevalue(client), mode, live_url)
    assert out["opened_done"] is False and out["names"] == ["run_rollout", "terminal", "keystrokes"]
    assert (out["ran"]["output"], out["ran"]["exit_code"]) == ("/workspace/work\n", 0)
    final = out["final"]
    assert (final["status"], final["reward"], final["done"], final["step_count"]) == ("completed", 1.0, True, 2)
    assert [r["exit_code"] for r in final["verify_results"]] == [0, 0] and final["isolation"] == "bwrap"
    # Gen B's production mode sends its tools over HTTP JSON-RPC (not counted as WS steps).
    assert (out["episode_id"], out["step_count"]) == ("compat-episode", 0 if mode.endswith("production") else 3)


@pytest.mark.parametrize("client", ["gen_a", "gen_b"])
def test_an_interactive_episode_through_the_generic_client(request: pytest.FixtureRequest, live_url: str,
                                                           client: str) -> None:
    out = drive(request.getfixturevalue(client), "episode-generic", live_url)
    assert out["opened_done"] is False and out["instruction"].startswith("Write 42")
    assert out["ran"]["exit_code"] == 0 and out["ran"]["output"].rstrip().endswith("/work")
    assert (out["reward"], out["done"], out["final"]["status"]) == (1.0, True, "completed")
    assert out["state_episode"]["status"] == "completed" and out["state_episode"]["reward"] == 1.0


def test_openenv_white_box_loop_drives_an_episode(gen_b: Path, live_url: str) -> None:
    """openenv 0.10's own `MCPHarnessAdapter.run_white_box` and `build_harness_rollout_func` drive episodes
    through `coding_agent_env.harness` (a scripted model step stands in for the trainer's model)."""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([str(gen_b), str(DRIVERS.with_name("harness_driver.py")), live_url],
                          capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["opening"][0]["role"] == "user" and out["opening"][0]["content"].startswith("Write 42")
    assert "Setup: 1 command(s) passed." in out["opening"][0]["content"]
    assert out["done"] is True and out["completion_ids"] == [100, 101, 102, 103]
    assert out["tool_messages"][0] == "[exit code 0]"
    assert "not both" in out["tool_messages"][1] and out["errors"][1] and not out["errors"][2]
    assert out["tool_messages"][2] == "42\n/workspace/work\n[exit code 0]"
    assert out["tool_messages"][3] == "Episode completed: 2/2 verify commands passed; reward 1"
    assert (out["env_reward"], out["verify_done"], out["metrics"]["status"]) == (1.0, True, "completed")
    assert out["trl"] == [[1.0], [0.0]]  # the wrong answer, with nothing written: both verify commands fail


CALLER_TOKEN = "compat-caller-token-7e2"


def drive_with(python: Path, mode: str, url: str, token: str | None) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "COMPAT_API_TOKEN"}
    if token is not None:
        env["COMPAT_API_TOKEN"] = token
    done = subprocess.run([str(python), str(DRIVERS), mode, url], capture_output=True, text=True, timeout=600,
                          env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def guarded_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with launch_server(tmp_path_factory.mktemp("guarded"), env={"API_TOKEN": CALLER_TOKEN}) as url:
        yield url


@pytest.mark.parametrize("mode", ["mcp-production", "mcp-ws", "mcp-async"])
def test_gen_b_carries_the_caller_token_in_its_headers(gen_b: Path, guarded_url: str, mode: str) -> None:
    """openenv 0.10's clients take `headers=`: with `X-API-Token` they run a rollout on a guarded server (the
    header leaves `Authorization` to a private Space's gateway); without it, or with a wrong one, they fail
    naming the 401."""
    out = drive_with(gen_b, mode, guarded_url, CALLER_TOKEN)
    assert out["reward"] == 1.0
    for token in (None, "wrong"):
        refused = drive_with(gen_b, f"refused-{mode}", guarded_url, token)
        assert refused["refused"] and "401" in refused["error"], refused


def test_gen_a_cannot_carry_a_token(gen_a: Path, guarded_url: str) -> None:
    """openenv-core 0.3's clients send no headers: a guarded server refuses them (documented)."""
    refused = drive_with(gen_a, "refused-mcp-ws", guarded_url, None)
    assert refused["refused"] and "401" in refused["error"], refused
