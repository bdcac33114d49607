"""The hostile-agent suite: each attack an RL policy could learn, one shell command (or a small file) at a time,
run through a live server on the local backend (bubblewrap, and forced to its Landlock tier) and on Docker.

For every case: while the hostile rollout runs, the server's `/health` answers within `HEALTH_WORST_S`
(probed every 0.1 s from another thread), its event-loop watchdog counts no stall (the loop held half a second)
and a well-behaved rollout in another session finishes with its honest
reward; the hostile rollout ends by its own deadline with a scored result (`completed` / `agent_failed` /
`agent_timeout`, a reward, never `infra_error` or a protocol error) whose expected reward and notes the case
states; and nothing of it is left on the host (processes of the server's sandbox uids, mounts, sandbox
directories, control groups). Attacks on task sources, the image route and the batch runner are in
tests/tasks and tests/runs; more on the verifier's import path in tests/e2e and tests/backends/test_path_guard.py.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from coding_agent_env.client import CodingAgentEnv
from coding_agent_env.models import RolloutResult
from tests.helpers import leftovers, poll, sandbox_cgroups
from tests.hostile.server import CANARY, CANARY_FILE, HealthProbe, HostileServer

HEALTH_WORST_S = 1.0
"""The slowest `/health` answer allowed while an attack runs."""
CLEANUP_DEADLINE_S = 30.0
SCORED = {"completed", "agent_failed", "agent_timeout"}

BENIGN: dict[str, Any] = {
    "task_id": "benign",
    "instruction": "Create hello.txt containing 'hi'.",
    "agent": "oracle",
    "solution": ["echo hi > hello.txt"],
    "verify": ["grep -qx hi hello.txt"],
}

def _deep(root: str, depth: int = 3000) -> str:
    """A shell command that makes `root` hold a chain of `depth` nested directories (in Python: a shell loop of
    `mkdir` takes minutes on a loaded machine)."""
    return (f"mkdir -p {root} && python3 -c 'import os\nos.chdir(\"{root}\")\n"
            f"for _ in range({depth}): os.mkdir(\"d\"); os.chdir(\"d\")'")


def _writer(script: str) -> str:
    """An oracle step that writes the agent's `evil.py` (verify then runs it: a verifier that runs agent code)."""
    return f"cat > evil.py <<'PY'\n{script}\nPY"


@dataclass(frozen=True)
class Attack:
    """One hostile rollout and what its result must say."""

    name: str
    request: dict[str, Any]
    reward: float
    check: Callable[[RolloutResult], None] = lambda result: None
    backends: frozenset[str] = field(default_factory=lambda: frozenset({"local", "docker"}))


def _no_secret(needle: str) -> Callable[[RolloutResult], None]:
    def check(result: RolloutResult) -> None:
        assert needle not in result.model_dump_json(), f"host content {needle!r} reached the result"

    return check


def _hit(word: str) -> Callable[[RolloutResult], None]:
    def check(result: RolloutResult) -> None:
        assert any(word in hit for hit in result.limits_hit), f"limits_hit does not mention {word!r}: {result.limits_hit}"

    return check


def _noted(result: RolloutResult) -> None:
    assert result.reward_note, "the ignored reward file is not explained in reward_note"


_EXIT_0 = "import os\nos._exit(0)\n"
_SHADOWS = ("json.py", "unittest/__init__.py", "unittest/__main__.py", "pytest.py", "sitecustomize.py",
            "apport_python_hook.py")
"""Modules the agent plants beside its own (the workdir) and beside a script it owns (`runtime/`): each exits 0
wherever Python would import it."""
_PLANT = "mkdir -p unittest runtime/unittest && " + " && ".join(
    f"printf '{_EXIT_0}' > {name} && cp {name} runtime/{name}" for name in _SHADOWS)
_FAILING_TEST = "import json, unittest\n\n\nclass T(unittest.TestCase):\n    def test(self):\n        self.fail()\n"
_REWRITE_GUARD = (
    "import os, shutil\nguard = os.environ.get('PYTHONPATH') or '/nonexistent'\n"
    "for name in ('sitecustomize.py', 'json.py'):\n    try:\n"
    "        open(os.path.join(guard, name), 'w').write('import os\\nos._exit(0)\\n')\n"
    "    except OSError:\n        pass\n"
    "for move in (lambda: os.chmod(guard, 0o777), lambda: os.rename(guard, guard + '.x'),"
    " lambda: shutil.rmtree(guard)):\n    try:\n        move()\n    except OSError:\n        pass\n"
    "raise SystemExit(1)"
)
"""Code an artifact runs in verify command 1: every way to change the path guard for command 2."""


ATTACKS = [
    # 1. The agent's log becomes a FIFO with no writer: collection must not open it (it would block forever).
    Attack("fifo-agent-log", {
        "solution": ["rm -f /logs/agent/agent.log && mkfifo /logs/agent/agent.log"],
        "verify": ["true"],
    }, reward=1.0),
    # ... and a symlink to a host file in its place is never followed.
    Attack("symlink-agent-log", {
        "solution": ["rm -f /logs/agent/agent.log && ln -s /etc/passwd /logs/agent/agent.log"],
        "verify": ["true"],
    }, reward=1.0, check=_no_secret("root:x:0:0")),
    # 1b. A verifier that runs agent code makes the reward file a FIFO (clean room: evil.py is the artifact).
    Attack("fifo-reward-file", {
        "solution": [_writer("import os\nos.mkfifo(os.environ['REWARD_FILE'])")],
        "artifacts": ["evil.py"],
        "verify": ["python3 evil.py"],
        "reward_file_required": True,
    }, reward=0.0, check=_noted),
    # 2. A tree deeper than any recursion limit where verify cleans up (/logs/tests made afresh for /tests).
    Attack("deep-tests-tree", {
        "solution": [_deep("/logs/tests")],
        "verify_files": {"test.sh": "echo 1 > /logs/verifier/reward.txt\n"},
        "verify_files_root": "/tests",
        "verify": ["bash /tests/test.sh"],
        "reward_file_required": True,
    }, reward=1.0),
    Attack("deep-verifier-tree", {
        "solution": [_deep("/logs/verifier")],
        "verify": ["echo 0 > \"$REWARD_FILE\""],
        "reward_file_required": True,
    }, reward=0.0),
    Attack("deep-workspace-tree", {
        "solution": [_deep("deep")],
        "verify": ["test -d deep/d"],
    }, reward=1.0),
    # 3. Deep JSON as the reward: a parse that raised would turn this 0 into an unscored error.
    Attack("deep-json-reward", {
        "solution": [_writer(
            "import os\nd = os.path.dirname(os.environ['REWARD_FILE'])\n"
            "open(os.path.join(d, 'reward.json'), 'w').write('[' * 4096)")],
        "verify": ["python3 evil.py"],
        "reward_file_required": True,
    }, reward=0.0, check=_noted),
    Attack("binary-reward", {
        "solution": [_writer(
            "import os\nopen(os.environ['REWARD_FILE'], 'wb').write(b'\\xff\\xfe\\xed' * 1000 + b'\\x00')")],
        "verify": ["python3 evil.py"],
        "reward_file_required": True,
    }, reward=0.0, check=_noted),
    # Workspace files that are not regular: a FIFO and a symlink out are never read back.
    Attack("fifo-and-symlink-in-workspace", {
        "solution": ["mkfifo pipe.txt && ln -s /etc/passwd passwd.txt && echo hi > hello.txt"],
        "verify": ["grep -qx hi hello.txt"],
    }, reward=1.0, check=_no_secret("root:x:0:0")),
    # Declared artifacts that are a FIFO and a symlink to a host file: not taken into the clean room.
    Attack("fifo-and-symlink-artifacts", {
        "solution": ["mkfifo a.txt && ln -s /etc/passwd b.txt"],
        "artifacts": ["a.txt", "b.txt"],
        "verify": ["test -f a.txt || test -f b.txt"],
    }, reward=0.0, check=_no_secret("root:x:0:0")),
    # Planted standard-library and tool names in the workdir and a script's directory: the verifier's own run
    # (json, unittest, a script importing its sibling) uses the real ones, so the failing checks fail; the agent's
    # own module still imports (on the safe path alone the last check fails too: 0.0).
    Attack("planted-shadows", {
        "solution": [_PLANT, "printf 'X = 1\\n' > runtime/sibling.py && printf 'import json, sibling\\n"
                             "raise SystemExit(json.loads(\"7\"))\\n' > runtime/run.py"],
        "verify_files": {"test_fail.py": _FAILING_TEST},
        "verify": ["python3 -m unittest -q test_fail", "python3 -c 'import json; raise SystemExit(json.loads(\"1\"))'",
                   "python3 runtime/run.py", "python3 runtime/run.py; test $? = 7"],
    }, reward=0.25),  # the last passes: the agent's own module imports, the real json parses 7
    # Verify command 1 (the agent's code) rewrites the path guard for command 2: it cannot.
    Attack("rewrite-path-guard", {
        "solution": [_writer(_REWRITE_GUARD)],
        "verify": ["python3 evil.py", "python3 -c 'import sys; sys.exit(1)'"],
    }, reward=0.0),
    Attack("rewrite-path-guard-as-root", {
        "solution": [_writer(_REWRITE_GUARD)],
        "verify": ["python3 evil.py", "python3 -c 'import sys; sys.exit(1)'"],
        "verify_user": "root",
    }, reward=0.0),
    # A log of binary junk far beyond the tail kept.
    Attack("binary-log-flood", {
        "solution": ["head -c 20000000 /dev/urandom"],
        "verify": ["true"],
    }, reward=1.0),
    # A process that leaves its group and outlives the agent: teardown still ends it.
    Attack("escaped-background-process", {
        "solution": ["setsid nohup sleep 1000 >/dev/null 2>&1 & disown; true"],
        "verify": ["true"],
    }, reward=1.0),
    # 6. A fork bomb: the sandbox's pids limit holds it, the agent's deadline ends it, the result says so.
    Attack("fork-bomb", {
        "solution": ["bomb() { bomb | bomb & }; bomb; sleep 5"],
        "agent_timeout_s": 10,
        "limits": {"max_processes": 64},
        "verify": ["true"],
    }, reward=1.0, check=_hit("process")),
    # 7. The operator's secrets: every process's environment (the server's, pid 1's, other sandboxes'), the
    # server's state dir (a Landlock sandbox's workspace is below it: `../..`), other sandboxes' directories.
    Attack("read-other-processes-environ", {
        "solution": ["cat /proc/1/environ /proc/[0-9]*/environ > found.txt 2>/dev/null; cat found.txt; true"],
        "verify": ["! grep -q CAE_HOSTILE_CANARY found.txt"],
    }, reward=1.0, check=_no_secret(CANARY)),
    Attack("read-the-servers-state", {
        "solution": [f"cat ../../{CANARY_FILE} ../../*/work/* ../../*/home/* /proc/1/cwd/* > found.txt 2>/dev/null;"
                     " ls -a ../.. >> found.txt 2>/dev/null; cat found.txt; true"],
        "verify": [f"! grep -q {CANARY_FILE} found.txt", "! grep -q '^hi$' found.txt"],
    }, reward=1.0, check=_no_secret(CANARY)),
    # 6. The disk filled, then emptied before anyone looked: the high-water mark still says it was hit.
    Attack("disk-filled-then-emptied", {
        "solution": ["dd if=/dev/zero of=big bs=1M count=200 2>/dev/null; rm -f big; true"],
        "limits": {"disk_mb": 32},
        "verify": ["true"],
    }, reward=1.0, check=_hit("disk"), backends=frozenset({"local"})),
]


async def _rollout(server: HostileServer, request: dict[str, Any]) -> tuple[RolloutResult, float]:
    async with CodingAgentEnv(server.http) as env:
        await env.reset()
        start = time.monotonic()
        result = await env.run_rollout(**request)
        return result, time.monotonic() - start


def _left(server: HostileServer) -> dict[str, list[str]]:
    """What the server's sandboxes left on the host (processes, mounts, dirs, its cgroups)."""
    left = leftovers(server.settings())
    left.pop("cgroups", None)  # the test's own, not the server's: checked by the server's pid below
    dirs = [entry for entry in left.pop("dirs", []) if entry != CANARY_FILE]  # the operator's, put there
    if dirs:
        left["dirs"] = dirs
    groups = sandbox_cgroups(server.proc.pid)
    if groups:
        left["cgroups"] = groups
    return left


@pytest.mark.parametrize("attack", ATTACKS, ids=lambda attack: attack.name)
async def test_attack(attack: Attack, hostile_server: tuple[str, HostileServer]) -> None:
    backend, server = hostile_server
    kind = "local" if backend.startswith("local") else backend  # a tier of the local backend runs its cases
    if kind not in attack.backends:
        pytest.skip(f"{attack.name}: not a {backend} case")
    if backend == "local-landlock" and attack.request.get("verify_files_root") == "/tests":
        pytest.skip(f"{attack.name}: hidden tests at /tests are refused by the Landlock tier (no bind mounts)")
    if backend == "local-landlock" and (attack.request.get("agent_user") or attack.request.get("verify_user")):
        pytest.skip(f"{attack.name}: other users are refused by the Landlock tier (one host user)")
    request = {"task_id": attack.name, "agent": "oracle", "instruction": f"attack: {attack.name}",
               "sandbox": kind, "agent_timeout_s": 60, "command_timeout_s": 60, **attack.request}
    stalls_before = server.loop_stats()["stalls"]
    with HealthProbe(server.http) as probe:
        (hostile, took), (benign, _) = await asyncio.wait_for(
            asyncio.gather(_rollout(server, request), _rollout(server, {**BENIGN, "sandbox": kind})),
            timeout=300,
        )
    summary = json.dumps({"status": hostile.status, "reward": hostile.reward, "note": hostile.reward_note,
                          "error": hostile.error, "limits_hit": hostile.limits_hit})
    assert not probe.failures and probe.worst_s < HEALTH_WORST_S, (
        f"/health stalled during {attack.name}: worst {probe.worst_s:.2f} s, failures {probe.failures[:3]}")
    assert probe.answers > 0
    loop = server.loop_stats()
    assert loop["stalls"] == stalls_before, f"{attack.name} held the server's event loop: {loop['last_stall']}"
    assert benign.status == "completed" and benign.reward == 1.0, f"the other session suffered: {benign.error}"
    assert hostile.status in SCORED, f"{attack.name} escaped scoring: {summary}"
    assert hostile.reward == attack.reward, f"{attack.name}: {summary}"
    attack.check(hostile)
    # Its own deadline: the agent's, each verify command's, and the fixed stages' (generous for a loaded machine).
    assert took < request["agent_timeout_s"] + 2 * request["command_timeout_s"] + 60
    await poll(lambda: not _left(server), lambda: f"teardown after {attack.name}, which left behind: {_left(server)}",
               timeout_s=CLEANUP_DEADLINE_S, interval_s=0.1)
