"""OpenEnv's `opencode_env` / `pi_env` clients, as written upstream, against this server: a drop-in.

The client (upstream_driver.py, in the openenv 0.10 virtualenv, through OpenEnv's own `MCPToolClient`) sends
upstream's whole argument set and parses every reply with a model of upstream's `RolloutResult`. The servers
are configured the way an upstream Space is: the `vllm` catalog entry from `VLLM_URL` (without `/v1`),
`VLLM_API_KEY` and `VLLM_MODEL`; `DEFAULT_AGENT=pi` for the pi_env drop-in. The LLM is the scripted fake
(tests/fakes/llm.py, an OpenAI-compatible server in this process): no real model can run here.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coding_agent_env.agents.install import status
from coding_agent_env.agents.registry import cli_specs
from coding_agent_env.settings import Settings
from tests.agents.sessions import CORRECT, TASK, VERIFY, session, write_file_command
from tests.backends.conftest import docker_engine  # noqa: F401 (a fixture)
from tests.compat.conftest import launch_server
from tests.fakes.llm import FakeLLM, FakeLLMServer, Reply

DRIVER = Path(__file__).with_name("upstream_driver.py")
SERVER_KEY = "sk-upstream-space-SECRET-0123456789"
MODEL = "fake/coder-1"


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(FakeLLM(api_key=SERVER_KEY)) as server:
        yield server


def space_env(fake: FakeLLMServer, **extra: str) -> dict[str, str]:
    root = fake.base_url.removesuffix("/v1")
    return {"VLLM_URL": root, "VLLM_API_KEY": SERVER_KEY, "VLLM_MODEL": MODEL, **extra}


@pytest.fixture(scope="module")
def servers(fake: FakeLLMServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """One server per upstream env: OpenCode's (the default agent) and Pi's (`DEFAULT_AGENT=pi`)."""
    with launch_server(tmp_path_factory.mktemp("opencode"), space_env(fake)) as opencode, \
            launch_server(tmp_path_factory.mktemp("pi"), space_env(fake, DEFAULT_AGENT="pi")) as pi:
        yield {"opencode": opencode, "pi": pi}


def drive(python: Path, flavour: str, url: str, args: dict[str, Any]) -> dict[str, Any]:
    done = subprocess.run([str(python), str(DRIVER), flavour, url, json.dumps(args)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def require_agent(name: str) -> None:
    agents_dir = Settings().agents_dir
    for spec in cli_specs():
        if spec.name == name and not status(spec, agents_dir).installed:
            pytest.skip(f"{name} is not installed (coding-agent-env agents install)")


@pytest.mark.parametrize("flavour", ["opencode", "pi"])
def test_a_rollout_through_upstreams_client(gen_b: Path, servers: dict[str, str], fake: FakeLLMServer,
                                            flavour: str) -> None:
    """OpenCodeEnv names the catalog entry; PiEnv passes base_url + api_key + model itself."""
    require_agent(flavour)
    fake.app.reset(session(flavour, write_file_command("binary_search.py", CORRECT)))
    if flavour == "opencode":
        llm: dict[str, Any] = {"endpoint": "vllm"}
    else:
        llm = {"base_url": fake.base_url, "api_key": SERVER_KEY, "model": MODEL}
    out = drive(gen_b, flavour, servers[flavour], {**llm, "instruction": TASK, "verify": VERIFY,
                                                    "task_id": "binary_search_v1", "agent_timeout_s": 120.0})
    result, raw = out["parsed"], out["raw"]
    assert (raw["status"], raw["agent"]) == ("completed", flavour), (result["error"], result["agent_log_tail"])
    assert (result["reward"], result["agent_exit_code"], result["error"]) == (1.0, 0, None), result["agent_log_tail"]
    assert (result["task_id"], result["mode"]) == ("binary_search_v1", "transparent_proxy")
    assert result["sandbox_id"] and result["wall_s"] > 0 and raw["isolation"] == "bwrap"
    assert result["files"]["binary_search.py"] == CORRECT
    assert [(r["cmd"], r["exit_code"]) for r in result["verify_results"]] == [(VERIFY[0], 0)]
    turns = result["proxy_turns"]
    assert [t["turn"] for t in turns] == list(range(len(fake.app.requests))) and len(turns) >= 2
    for turn in turns:
        assert turn["upstream_status"] == 200 and turn["upstream_error"] is None and turn["timestamp"] > 0
        n = len(turn["completion_token_ids"])
        assert n > 0 and len(turn["per_token_logps"]) == len(turn["completion_tokens"]) == n
    assert result["proxy_log_tail"].splitlines()[0].startswith("turn 0 200 ")
    # The catalog entry came from upstream's variable names; thinking off is vllm's default for null.
    for seen in fake.app.requests:
        body = seen.body or {}
        assert seen.headers["authorization"] == f"Bearer {SERVER_KEY}" and body["model"] == MODEL
        assert body["top_logprobs"] == 5 and body.get("max_tokens", 0) <= 4096
        thinking = body.get("chat_template_kwargs")
        assert thinking == ({"enable_thinking": False} if flavour == "opencode" else None)
    assert SERVER_KEY not in json.dumps(raw)


def test_a_setup_failure_parses(gen_b: Path, servers: dict[str, str], fake: FakeLLMServer) -> None:
    fake.app.reset([Reply(content="never asked")])
    out = drive(gen_b, "opencode", servers["opencode"], {
        "endpoint": "vllm", "instruction": "Never reached.", "setup": ["echo preparing; exit 3"], "verify": ["true"],
    })
    result, raw = out["parsed"], out["raw"]
    assert raw["status"] == "setup_failed" and result["reward"] is None and result["agent_exit_code"] is None
    assert [(r["exit_code"], r["stdout"]) for r in result["setup_results"]] == [(3, "preparing\n")]
    assert result["verify_results"] == [] and result["proxy_turns"] == [] and fake.app.requests == []
    assert result["error"] and "setup" in result["error"] and raw["error_detail"]["stage"] == "setup"
    assert result["task_id"] == ""


@pytest.mark.usefixtures("docker_engine")
def test_an_infra_error_parses(gen_b: Path, fake: FakeLLMServer, tmp_path: Path) -> None:
    """A Docker-backed server (as an upstream Space on a sandbox service) asked for an image the engine refuses
    (no registry is contacted: the reference is malformed). Skipped without a Docker daemon, except under CI."""
    with launch_server(tmp_path, space_env(fake, SANDBOX_BACKENDS="docker")) as url:
        out = drive(gen_b, "opencode", url, {"endpoint": "vllm", "instruction": "x", "verify": ["true"],
                                             "template": "Not A Valid Ref!"})
    result, raw = out["parsed"], out["raw"]
    assert raw["status"] == "infra_error" and result["reward"] is None
    assert result["error"] and "invalid reference format" in result["error"]
    assert (raw["error_detail"]["type"], raw["error_detail"]["stage"]) == ("SandboxError", "provision")
    assert result["verify_results"] == [] and result["sandbox_id"] == ""
