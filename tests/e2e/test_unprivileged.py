"""The laptop case: the server run by an ordinary user, not root. The local backend then takes its other path
(bubblewrap in a user namespace, `prlimit` inside it, a network namespace per command, and a forwarder for an
agent's relay port), which the rest of the suite, run as root in CI, never takes.

The rollouts run in a child process whose uid is dropped with `setpriv` (to a uid of this test's sandbox pool,
so `assert_no_leftovers` sees anything it leaves): the example task with the oracle, and the binary-search task
with Terminus and with Pi (from the agents dir this suite installed) against the scripted fake LLM."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from coding_agent_env.agents.install import status
from coding_agent_env.agents.pi import PI
from coding_agent_env.settings import Settings
from tests.helpers import uid_pool

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import asyncio, json, os, sys
from pathlib import Path
from coding_agent_env.cli.main import load_task
from coding_agent_env.models import LimitsRequest, RolloutRequest
from coding_agent_env.rollout import run_rollout
from coding_agent_env.agents.install import status
from coding_agent_env.agents.pi import PI
from coding_agent_env.settings import Settings
from tests.helpers import uid_pool
from tests.agents.sessions import CORRECT, TASK, VERIFY, session, write_file_command
from tests.fakes.llm import FakeLLM, FakeLLMServer

async def main() -> None:
    settings = Settings(state_dir=sys.argv[1], agents_dir=sys.argv[2])
    seen = {}
    oracle = await run_rollout(load_task(str(Path("examples/binary_search.yaml"))), settings=settings)
    seen["oracle"] = oracle
    # Past a watched disk budget (no tmpfs without root): its commands are killed soon after.
    writer = "for i in $(seq 60); do head -c 10M /dev/zero > f$i; sleep 0.1; done"
    seen["disk"] = await run_rollout(RolloutRequest(
        instruction="fill the disk", agent="oracle", solution=[writer], limits=LimitsRequest(disk_mb=64),
        verify=["test $(du -sm . | cut -f1) -le 400"]), settings=settings)
    with FakeLLMServer(FakeLLM(api_key="sk-laptop")) as fake:
        for agent in sys.argv[3:]:
            fake.app.reset(session(agent, write_file_command("binary_search.py", CORRECT), "id -u"))
            request = RolloutRequest(instruction=TASK, agent=agent, base_url=fake.base_url, api_key="sk-laptop",
                                     model="fake/m", verify=VERIFY)
            seen[agent] = await run_rollout(request, settings=settings)
    print(json.dumps({name: result.model_dump(mode="json") for name, result in seen.items()}))

asyncio.run(main())
"""


def _as(uid: int, *argv: str) -> bool:
    """Whether argv, run as `uid`, succeeds."""
    command = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv]
    try:
        return subprocess.run(command, cwd=ROOT, capture_output=True, timeout=60, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


async def test_rollouts_as_an_ordinary_user(settings: Settings, assert_no_leftovers: None) -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None or shutil.which("bwrap") is None:
        pytest.skip("needs root to drop to an ordinary user (setpriv) and a system bubblewrap")
    uid = uid_pool(settings)[-1]  # in this test's pool: leftovers are seen
    if not _as(uid, "bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "true"):
        pytest.skip("this kernel gives ordinary users no user namespaces: the server would run unisolated")
    if not _as(uid, sys.executable, "-c", "import coding_agent_env, tests.fakes.llm"):
        pytest.skip(f"an ordinary user cannot read this checkout or its virtualenv ({ROOT}, {sys.executable})")
    agents = ["terminus"] + (["pi"] if status(PI, Settings().agents_dir).installed else [])
    home = Path(tempfile.mkdtemp(prefix="cae-laptop-"))
    try:
        os.chown(home, uid, uid)
        state = home / "state"
        env = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8"}
        argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", sys.executable, "-c", CHILD,
                str(state), str(Settings().agents_dir), *agents]
        done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, timeout=600, check=False)
        assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
        results = json.loads(done.stdout)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    disk = results.pop("disk")
    assert disk["status"] == "agent_failed" and disk["reward"] == 1.0, (disk["error"], disk["verify_results"])
    assert disk["limits_hit"] == ["disk quota exceeded: the sandbox's disk budget of 64 MB"]
    # Honest without root: memory and CPU are per process, the disk budget is watched, not a hard limit.
    assert disk["limit_scopes"] == {"data": "process", "fsize": "process", "cpu": "process", "nproc": "sandbox",
                                    "disk": "watched"}
    assert set(results) == {"oracle", *agents}
    for name, result in results.items():
        assert (result["status"], result["reward"], result["isolation"]) == ("completed", 1.0, "bwrap"), (
            name, result["error"], result["agent_log_tail"][-2000:])
        assert {"data", "fsize", "cpu"} <= set(result["limits"]), result["limits"]  # set by prlimit inside
    assert results["terminus"]["network"] == "none"
    if "pi" in results:  # through the forwarder in a namespace of its own
        assert results["pi"]["network"] == "llm" and len(results["pi"]["proxy_turns"]) == 3
    ran_as = [t for t in results["terminus"]["agent_events"]["tool_calls"] if t["input"] == "id -u"]
    assert ran_as and results["terminus"]["proxy_turns"][-1]["request_messages"][-1]["content"].split()[-1] == "1000"
