"""The image run as Hugging Face runs a Docker Space (marker `image`; needs a reachable dockerd, skipped otherwise):
uid 1000, Docker's default seccomp profile and masked /proc paths, no added capability, with the operator's
secrets (fake values) and a caller token set. What a caller can do there is what the README's Space section
promises:

- a request without the token is refused (401) on every door that runs anything; /health stays open;
- rollouts are isolated (never `none`), and a caller's commands that read /proc/1/environ, every process's
  environment, the server's files and its state dir find no secret;
- the bundled example and the tab's presets pass with the oracle and fail with nop.

The container uses `--network host` (the CI dockerd has no bridge) and binds 127.0.0.1 only.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from coding_agent_env.api.ui.presets import PRESETS
from tests.image.build import docker
from tests.image.test_image import _free_port, _wait_healthy, image_or_skip

pytestmark = pytest.mark.image

ROOT = Path(__file__).resolve().parents[2]
FAKE_SECRETS = {
    "OPENAI_API_KEY": "sk-space-fake-" + secrets.token_hex(8),
    "HF_TOKEN": "hf_spacefake" + secrets.token_hex(8),
}
TOKEN = "caller-" + secrets.token_hex(12)
ROLLOUT_DEADLINE_S = 300.0
SNOOP = [
    # What a hostile caller's commands try, each allowed to fail: the server's environment (PID 1 in the
    # container), every process's, the server's files and state dir, the home directory, the image's ENV.
    "cat /proc/1/environ",
    "for f in /proc/[0-9]*/environ; do cat $f; echo; done",
    "for f in /proc/[0-9]*/cmdline; do cat $f; echo; done",
    "env",
    "cat /proc/1/mem | head -c 100000 | strings",
    "ls -la /tmp /tmp/coding-agent-env; find /tmp/coding-agent-env -maxdepth 3 -type f -exec cat {} +",
    "cat /home/user/.bash_history /app/server/app.py",
]


@pytest.fixture(scope="module")
def space() -> Iterator[str]:
    """The image, running as a Space runs it; its URL."""
    tag = image_or_skip()
    name, port = f"cae-space-test-{secrets.token_hex(4)}", _free_port()
    env = {**FAKE_SECRETS, "API_TOKEN": TOKEN, "HOST": "127.0.0.1", "PORT": str(port)}
    flags = [arg for key, value in env.items() for arg in ("-e", f"{key}={value}")]
    # No --privileged, --cap-add or --security-opt: Docker's defaults, as a Space gets them.
    run = docker("run", "-d", "--name", name, "--user", "1000", "--network", "host", *flags, tag)
    assert run.returncode == 0, run.stderr.decode()
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, name)
        yield url
    finally:
        docker("rm", "-f", name, timeout=60)


def _call(url: str, arguments: dict[str, Any], token: str | None = TOKEN) -> httpx.Response:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "run_rollout", "arguments": arguments}}
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return httpx.post(url + "/mcp", json=body, headers=headers, timeout=ROLLOUT_DEADLINE_S)


def _rollout(url: str, arguments: dict[str, Any]) -> dict[str, Any]:
    reply = _call(url, arguments)
    assert reply.status_code == 200, reply.text
    return reply.json()["result"]["data"]


def test_doors_need_the_token_and_health_stays_open(space: str) -> None:
    assert httpx.get(space + "/health", timeout=10).status_code == 200
    oracle = {"instruction": "x", "agent": "oracle", "solution": ["true"], "verify": ["true"]}
    assert _call(space, oracle, token=None).status_code == 401
    assert _call(space, oracle, token="wrong-" + TOKEN).status_code == 401
    assert httpx.post(space + "/reset", json={}, timeout=30).status_code == 401
    assert _rollout(space, oracle)["reward"] == 1.0


def test_a_callers_commands_are_isolated_and_find_no_secret(space: str) -> None:
    result = _rollout(space, {"instruction": "snoop", "agent": "oracle", "solution": SNOOP,
                              "verify": ["cat /proc/1/environ", "env"], "task_id": "snoop"})
    assert result["isolation"] not in ("none", None), result["isolation"]
    text = json.dumps(result)
    for name, value in FAKE_SECRETS.items():
        assert value not in text, f"{name} reached the caller"
    assert TOKEN not in text


@pytest.mark.parametrize("agent", ["oracle", "nop"])
def test_the_bundled_example_and_presets_pass_with_the_oracle_and_fail_with_nop(space: str, agent: str) -> None:
    example = yaml.safe_load((ROOT / "examples" / "binary_search.yaml").read_text())
    tasks = {"example": example} | {name: preset.task_fields() for name, preset in PRESETS.items()}
    rewards = {}
    for name, fields in tasks.items():
        fields = json.loads(json.dumps(fields, default=str))
        result = _rollout(space, {**fields, "agent": agent})
        assert result["isolation"] not in ("none", None), (name, result["isolation"])
        rewards[name] = result["reward"]
    expected_pass = {name: agent == "oracle" and name != "failing" for name in tasks}
    assert {name: reward == 1.0 for name, reward in rewards.items()} == expected_pass, rewards


def test_natural_verify_shapes_keep_their_reward_on_the_space(space: str) -> None:
    """Hardened verify on the Space's tier (the sandbox runs as the server's own uid): the agent's modules import
    from the workdir as before (the path guard is read-only under Landlock), and a planted stdlib name shadows
    nothing."""
    result = _rollout(space, {
        "instruction": "x", "agent": "oracle", "files": {"json.py": "raise SystemExit(3)\n"},
        "solution": ["printf 'def answer():\\n    return 42\\n' > solution.py"],
        "verify": ["python3 -c 'import solution; assert solution.answer() == 42'",
                   "python3 -c 'import json; assert json.loads(\"[1]\") == [1]'"],
    })
    assert result["isolation"] == "landlock", result["isolation"]
    assert result["reward"] == 1.0, [(r["cmd"], r["stderr"][-300:]) for r in result["verify_results"]]


def test_a_space_with_persistent_storage_keeps_its_results_under_data(tmp_path: Path) -> None:
    """A Space with persistent storage mounts it at /data: every rollout the server runs lands in the results store
    there (and so survives a restart), with no setting of the operator's."""
    tag = image_or_skip()
    data = tmp_path / "data"
    data.mkdir()
    os.chown(data, 1000, 1000)
    name, port = f"cae-space-data-{secrets.token_hex(4)}", _free_port()
    run = docker("run", "-d", "--name", name, "--user", "1000", "--network", "host", "-v", f"{data}:/data",
                 "-e", "HOST=127.0.0.1", "-e", f"PORT={port}", tag)
    assert run.returncode == 0, run.stderr.decode()
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, name)
        done = _call(url, {"instruction": "x", "agent": "oracle", "solution": ["true"], "verify": ["true"],
                           "task_id": "kept"}, token=None)
        assert done.status_code == 200 and done.json()["result"]["data"]["reward"] == 1.0, done.text
        kept = docker("exec", name, "python3", "-c", "import sqlite3; print(sqlite3.connect("
                      "'/data/coding-agent-env/results.sqlite').execute('select count(*) from rollouts').fetchone()[0])")
        assert kept.returncode == 0 and kept.stdout.decode().strip() == "1", (kept.stdout + kept.stderr).decode()
    finally:
        docker("rm", "-f", name, timeout=60)
        subprocess.run(["rm", "-rf", str(data)], check=False)
