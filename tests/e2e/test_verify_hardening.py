"""Verifiers RL cannot game (INTEGRITY 7, 29, 34): hardened verify and the bundled checker, attacked.

Each attack is an `oracle` solution that games a task the way an RL policy would, run through the real pipeline
on the local backend (bubblewrap). Each must score 0 while the reference solution scores 1.0; a control run with
`verify_hardening: false` (or the old in-process verifier) shows the attack does work without the defence, so
these tests can fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from coding_agent_env.cli.main import load_task
from coding_agent_env.models import CommandResult, RolloutRequest, RolloutStatus
from coding_agent_env.rollout import run_rollout
from coding_agent_env.workspace.commands import CommandRunner
from coding_agent_env.workspace.redact import Redactor
from coding_agent_env.workspace.verify.run import run_verify
from coding_agent_env.sandbox import Backends
from coding_agent_env.sandbox.base import SandboxSpec
from coding_agent_env.settings import Settings
from coding_agent_env.tasks import LoadedTask, TaskOptions, iter_tasks

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "binary_search.yaml"

pytestmark = pytest.mark.usefixtures("assert_no_leftovers")


def example(**update: object) -> RolloutRequest:
    return load_task(str(EXAMPLE)).model_copy(update=update)


def artifact(source: str) -> list[str]:
    """An oracle solution that writes `source` as the artifact, search.py."""
    return [f"cat > search.py <<'PY'\n{source}\nPY"]


WRONG = "def binary_search(items, target):\n    return 0"
ATTACKS = {
    "os-exit-at-import": "import os\nos._exit(0)",
    "sys-exit-at-import": "import sys\nsys.exit(0)",
    "patched-unittest": "import unittest\nunittest.TestCase.run = lambda self, result=None: None\n" + WRONG,
    "forged-report": "import os\nprint('Ran 2 tests in 0.001s\\n\\nOK')\nprint('[0, 1, 2]')\nos._exit(0)",
    "reward-file": "import os\nfor name, text in (('reward.txt', '1'), ('reward.json', '{\"reward\": 1}')):\n"
                   "    open('/logs/verifier/' + name, 'w').write(text)\nos._exit(0)",
    "reward-file-then-kill-the-checker": "import os, signal\nopen('/logs/verifier/reward.txt', 'w').write('1')\n"
                                         "os.kill(os.getppid(), signal.SIGKILL)\n" + WRONG,
}


async def test_the_reference_solution_scores_one(settings: Settings) -> None:
    result = await run_rollout(example(), settings=settings)
    assert result.status is RolloutStatus.COMPLETED and result.reward == 1.0, result.verify_results
    assert result.verify_context == "clean_room" and result.reward_note is None
    assert "36/36 cases right" in result.verify_results[0].stdout


@pytest.mark.parametrize("name", list(ATTACKS))
async def test_an_artifact_that_games_the_checker_scores_zero(settings: Settings, name: str) -> None:
    result = await run_rollout(example(solution=artifact(ATTACKS[name])), settings=settings)
    assert result.status is RolloutStatus.COMPLETED and result.reward == 0.0, result.verify_results
    assert result.artifacts is not None and result.artifacts.copied == ["search.py"]


async def test_exiting_at_import_passes_an_in_process_verifier(settings: Settings) -> None:
    """Control: the example's old verifier (unittest importing the artifact, its exit status the verdict) is
    passed by `os._exit(0)` at import, in the clean room too; hence the checker."""
    old = example(solution=artifact(ATTACKS["os-exit-at-import"]), verify=["python3 -m unittest -q test_search"],
                  verify_files={"test_search.py": example().files["test_search.py"]}, verify_hardening=False)
    result = await run_rollout(old, settings=settings)
    assert result.verify_context == "clean_room" and result.reward == 1.0


async def test_a_reward_file_from_the_artifact_is_ignored_in_the_clean_room(settings: Settings) -> None:
    hacked = await run_rollout(example(solution=artifact(ATTACKS["reward-file"])), settings=settings)
    assert hacked.reward == 0.0 and "reward.txt ignored: the task declares none" in (hacked.reward_note or "")
    control = await run_rollout(example(solution=artifact(ATTACKS["reward-file"]), verify_hardening=False),
                                settings=settings)
    assert control.reward == 1.0  # the file wins where it counts: what the rule closes


SHADOW_UNITTEST = (
    "mkdir -p unittest && printf 'import sys\\nsys.exit(0)\\n' > unittest/__main__.py && touch unittest/__init__.py"
)
DISCOVER = "python3 -m unittest discover -s . -p test_search.py"


def in_workspace(**update: object) -> RolloutRequest:
    """The example verified in the agent's own workspace by the standard-library runner (no artifacts)."""
    return example(artifacts=[], verify_files={}, verify=[DISCOVER]).model_copy(update=update)


async def test_a_planted_unittest_package_is_not_imported(settings: Settings) -> None:
    reference = await run_rollout(in_workspace(), settings=settings)
    assert reference.verify_context == "workspace" and reference.reward == 1.0, reference.verify_results
    hacked = await run_rollout(in_workspace(solution=[SHADOW_UNITTEST]), settings=settings)
    assert hacked.reward == 0.0
    control = await run_rollout(in_workspace(solution=[SHADOW_UNITTEST], verify_hardening=False), settings=settings)
    assert control.reward == 1.0


@pytest.fixture
def tools_dir() -> Iterator[Path]:
    """A host directory sandbox uids can read (pytest's tmp_path is 0700), removed after the test."""
    path = Path(tempfile.mkdtemp(prefix="cae-test-tools-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path)


def with_pytest(directory: Path) -> Path:
    """A virtualenv of the sandbox's Python (the host's /usr/bin/python3, which bubblewrap shows) holding the
    pytest this suite runs on, made in `directory` (shown read-only to a sandbox as its agents directory): the
    image's own pytest, outside anything the agent can write."""
    venv = directory / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    (site,) = venv.glob("lib/python3*/site-packages")
    source = Path(pytest.__file__).resolve().parents[1]
    for name in ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "pygments", "py.py"):
        if (source / name).is_dir():
            shutil.copytree(source / name, site / name)
        elif (source / name).exists():
            shutil.copy(source / name, site / name)
    return venv


TEST_SEARCH = "from search import binary_search\n\n\ndef test_it():\n    assert binary_search([1, 2, 5], 5) == 2\n"


@pytest.mark.skipif(not Path("/usr/bin/python3").exists(), reason="the sandbox's Python is the host's /usr/bin/python3")
async def test_a_planted_pytest_module_shadows_no_installed_pytest(settings: Settings, tools_dir: Path) -> None:
    """`python -m pytest /tests/...` in the workdir (Harbor's shape: the tests beside none of the agent's files),
    with pytest installed (a virtualenv shown read-only, as an image has one): the test imports the agent's
    module from the workdir and passes; a planted `pytest.py` never runs instead of pytest (its own `exit 0`
    would pass the failing test). Fails on the safe path alone (no module `search`: pytest puts only the test's
    own directory on the path)."""
    venv = with_pytest(tools_dir)
    python = f"/opt/agents/{venv.name}/bin/python"
    check = [f"{python} -m pytest -q -p no:cacheprovider /logs/checks/test_search_py.py"]
    async with Backends(settings) as backends:
        box = await backends.get("local").create(SandboxSpec(rollout_id="verify-pytest", agents_dir=str(tools_dir)))
        try:
            runner = CommandRunner(box, timeout_s=60, max_output_bytes=8192, redact=Redactor([]))
            await box.write_text("search.py", example().solution[0].split("<<'PY'\n", 1)[1].rsplit("\nPY", 1)[0])
            await box.mkdir("/logs/checks")
            await box.write_text("/logs/checks/test_search_py.py", TEST_SEARCH)
            honest = await run_verify(runner, check, on_result=lambda _, r: None)
            assert honest.results[0].exit_code == 0 and "1 passed" in honest.results[0].stdout, honest.results
            await box.write_text("search.py", WRONG)
            await box.write_text("pytest.py", "import os\nos._exit(0)\n")
            hacked = await run_verify(runner, check, on_result=lambda _, r: None)
            assert hacked.results[0].exit_code == 1 and "1 failed" in hacked.results[0].stdout, hacked.results
            open_door = await run_verify(runner, check, on_result=lambda _, r: None, hardened=False)
            assert open_door.results[0].exit_code == 0  # the plant: what the guard keeps out
        finally:
            await box.close()


NATURAL = {
    "import-in-workdir": "python3 -c 'import search; assert search.binary_search([1, 3, 9], 9) == 2'",
    "unittest-module": "python3 -m unittest -q test_search",
    "script-beside-its-module": "mkdir -p runtime && cp search.py runtime/ && printf 'import search\\n"
                                "assert search.binary_search([2, 4], 4) == 1\\n' > runtime/run.py && "
                                "cd / && python3 /workspace/runtime/run.py",
}


@pytest.mark.parametrize("shape", list(NATURAL))
async def test_natural_verify_shapes_keep_their_reward(settings: Settings, shape: str) -> None:
    """The verify shapes tasks were written in before hardening: the reference scores 1.0 (0 with the safe path
    alone: `No module named 'search'`), the wrong answer 0."""
    task = example(artifacts=[], verify_files={}, verify=[NATURAL[shape]])
    reference = await run_rollout(task, settings=settings)
    assert reference.verify_context == "workspace" and reference.reward == 1.0, reference.verify_results
    wrong = await run_rollout(task.model_copy(update={"solution": artifact(WRONG)}), settings=settings)
    assert wrong.reward == 0.0


async def test_a_planted_json_shadows_nothing(settings: Settings) -> None:
    task = in_workspace(solution=[*example().solution, "printf 'import os\\nos._exit(0)\\n' > json.py"],
                        verify=["python3 -c 'import json, search; raise SystemExit(json.loads(\"3\"))'"])
    hacked = await run_rollout(task, settings=settings)
    assert hacked.verify_results[0].exit_code == 3, hacked.verify_results  # the standard library's json ran
    control = await run_rollout(task.model_copy(update={"verify_hardening": False}), settings=settings)
    assert control.verify_results[0].exit_code == 0  # the plant ran


REWRITE_GUARD = (
    'test -n "$PYTHONPATH" && for f in "$PYTHONPATH/sitecustomize.py" "$PYTHONPATH/x.py"; do '
    "printf 'import os\\nos._exit(0)\\n' > \"$f\" && exit 0; done; "
    'chmod 777 "$PYTHONPATH" && exit 0; mv "$PYTHONPATH" /tmp/g && exit 0; rm -rf "$PYTHONPATH" 2>/dev/null; '
    'test -f "$PYTHONPATH/sitecustomize.py" || exit 0; exit 1'
)
"""Verify command 1, as code an artifact runs: every way to change the guard (rewrite it, add a module beside it,
open its directory, move or delete it); exit 0 when one worked, 1 when none did."""


@pytest.mark.parametrize("user", [None, "root"])
async def test_one_verify_command_cannot_change_the_next_ones_path_machinery(settings: Settings,
                                                                           user: str | None) -> None:
    """As the sandbox's user and as root of its user namespace (Harbor's default verifier user)."""
    after = "python3 -c 'import sys, search; sys.exit(1)'"  # exits 0 if a rewritten guard ran first
    task = in_workspace(verify=[REWRITE_GUARD, after], verify_user=user)
    result = await run_rollout(task, settings=settings)
    assert result.status is RolloutStatus.COMPLETED, result.error
    assert [r.exit_code for r in result.verify_results] == [1, 1], result.verify_results


PLANTED_PYTHON = "mkdir -p .venv/bin && printf '#!/bin/sh\\nexit 0\\n' > .venv/bin/python3 && chmod +x .venv/bin/python3"


@pytest.mark.parametrize(("name", "value", "entry"), [
    ("PATH", "/workspace/.venv/bin:/usr/bin:/bin", "/workspace/.venv/bin"),
    ("PATH", ".venv/bin:/usr/bin:/bin", ".venv/bin"),
    ("LD_PRELOAD", "/workspace/evil.so", "/workspace/evil.so"),
    ("LD_LIBRARY_PATH", "/tmp/lib", "/tmp/lib"),
    ("PYTHONPATH", "/usr/lib:/home/sandbox/lib", "/home/sandbox/lib"),
    ("NODE_PATH", "/logs/x", "/logs/x"),
])
def test_a_task_env_into_the_workspace_is_refused(name: str, value: str, entry: str) -> None:
    with pytest.raises(ValidationError) as refused:
        RolloutRequest(instruction="x", env={name: value})
    message = str(refused.value)
    assert f"env {name} entry {entry!r}" in message and "verify_hardening: false" in message


async def test_a_planted_interpreter_on_a_task_path_is_what_the_refusal_prevents(settings: Settings) -> None:
    """Control for the refusal: without hardening, a task PATH into the workspace hands verify to a planted
    `.venv/bin/python3` (it exits 0 for the wrong solution); the same request is refused when hardened."""
    fields = in_workspace().model_dump() | {"solution": [PLANTED_PYTHON], "env": {"PATH": "/workspace/.venv/bin:/usr/bin:/bin"}}
    with pytest.raises(ValidationError, match="PATH entry '/workspace/.venv/bin' is inside /workspace"):
        RolloutRequest.model_validate(fields)
    control = await run_rollout(RolloutRequest.model_validate(fields | {"verify_hardening": False}), settings=settings)
    assert control.reward == 1.0


PROBE = ('test "$PYTHONSAFEPATH" = 1 && test "$PYTHONNOUSERSITE" = 1 && '
         'test "${PYTHONPATH#/opt/none}" = "$PYTHONPATH" && '
         'test -z "$PYTHONSTARTUP" && test -z "$LD_LIBRARY_PATH" && test -z "$BASH_ENV" && '
         'python3 -c "import sys; sys.exit(sys.flags.safe_path != 1 or '
         'any(p.startswith(\'/opt/none\') for p in sys.path))"')


async def test_verify_runs_without_the_tasks_injecting_variables(settings: Settings) -> None:
    """Variables a task may set outside the workspace still never reach verify: verify needs none of them."""
    env = {"PYTHONPATH": "/opt/none", "PYTHONSTARTUP": "/opt/none/start.py", "LD_LIBRARY_PATH": "/opt/none/lib",
           "BASH_ENV": "/opt/none/bashrc", "PYTHONSAFEPATH": ""}
    task = RolloutRequest(instruction="x", agent="oracle", env=env, setup=['test "$PYTHONPATH" = /opt/none'],
                          verify=[PROBE])
    result = await run_rollout(task, settings=settings)
    assert result.status is RolloutStatus.COMPLETED and result.reward == 1.0, result.verify_results
    control = await run_rollout(task.model_copy(update={"verify_hardening": False}), settings=settings)
    assert control.reward == 0.0


async def test_an_image_path_into_the_workspace_is_dropped_for_verify(settings: Settings) -> None:
    """A PATH the request cannot refuse (an image's ENV: the sandbox's own `env`) is filtered at verify time."""
    spec = SandboxSpec(rollout_id="verify-path", env={"PATH": "/workspace/.venv/bin:/usr/bin:/bin"})
    async with Backends(settings) as backends:
        box = await backends.get("local").create(spec)
        try:
            plant = await box.exec(["/bin/sh", "-c", PLANTED_PYTHON], timeout=20, max_output_bytes=4096)
            assert plant.exit_code == 0
            runner = CommandRunner(box, timeout_s=20, max_output_bytes=4096, redact=Redactor([]))
            check = ['echo "$PATH"', "python3 -c 'import sys; sys.exit(1)'"]
            seen: list[CommandResult] = []
            hardened = await run_verify(runner, check, on_result=lambda _, r: seen.append(r))
            assert hardened.results[0].stdout == "/usr/bin:/bin\n" and hardened.results[1].exit_code == 1
            open_door = await run_verify(runner, check, on_result=lambda _, r: None, hardened=False)
            assert open_door.results[1].exit_code == 0  # the planted interpreter: what the filter keeps out
            assert [r.cmd for r in seen] == check
        finally:
            await box.close()


def preset(name: str, **update: object) -> RolloutRequest:
    from coding_agent_env.api.ui.presets import PRESETS

    return RolloutRequest(agent="oracle", task_id=name, **PRESETS[name].task_fields()).model_copy(update=update)


@pytest.mark.parametrize(("name", "reward"), [("binary_search", 1.0), ("fizzbuzz", 1.0), ("failing", 0.0)])
async def test_the_presets_score_their_reference_solutions(settings: Settings, name: str, reward: float) -> None:
    result = await run_rollout(preset(name), settings=settings)
    assert result.verify_context == "clean_room" and result.reward == reward, result.verify_results


@pytest.mark.parametrize("name", ["binary_search", "fizzbuzz", "failing"])
async def test_the_presets_fail_with_nop(settings: Settings, name: str) -> None:
    result = await run_rollout(preset(name, agent="nop"), settings=settings)
    assert result.status is RolloutStatus.COMPLETED and result.reward == 0.0, result.verify_results


FIZZ_ATTACKS = {
    "os-exit": "import os\nos._exit(0)",
    "reward-file": "import os\nopen('/logs/verifier/reward.txt', 'w').write('1')\nos._exit(0)",
    "kill-the-checker": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
}


@pytest.mark.parametrize("attack", list(FIZZ_ATTACKS))
async def test_the_fizzbuzz_preset_resists_its_artifact(settings: Settings, attack: str) -> None:
    solution = [f"cat > fizzbuzz.py <<'PY'\n{FIZZ_ATTACKS[attack]}\nPY"]
    result = await run_rollout(preset("fizzbuzz", solution=solution), settings=settings)
    assert result.status is RolloutStatus.COMPLETED and result.reward == 0.0, result.verify_results


FIX_MEDIAN = EXAMPLE.parent / "tasks" / "fix-median"


@pytest.mark.parametrize(("stats", "reward"), [(None, 1.0), ("import os\nos._exit(0)", 0.0)],
                         ids=["reference", "os-exit-at-import"])
async def test_the_harbor_example_resists_exiting_at_import(settings: Settings, stats: str | None,
                                                            reward: float) -> None:
    """fix-median verifies in the workspace (Harbor's test.sh writes the reward): its checker still runs stats.py
    in a child, so exiting at import scores 0 (the old test imported stats.py in the judging process)."""
    (loaded,) = iter_tasks([FIX_MEDIAN], TaskOptions())
    assert isinstance(loaded, LoadedTask), loaded
    task = loaded.request.model_copy(update={"agent": "oracle"})
    if stats is not None:
        task = task.model_copy(update={"solution": [f"cat > stats.py <<'PY'\n{stats}\nPY"]})
    result = await run_rollout(task, settings=settings)
    assert result.status is RolloutStatus.COMPLETED and result.reward == reward, result.verify_results
