"""Verify's path guard on every backend (issue 42 item 1): where a backend shows it (`Sandbox.path_guard`: local
bubblewrap, local unisolated with a sandbox uid of its own, Docker with either transport), the natural verify
shapes import the agent's modules and a planted `json.py` shadows nothing; verify command 1 cannot change it
for command 2. Where a backend cannot promise it read-only (hf, e2b: commands run as the engine's own user,
which owns everything there), verify keeps the safe path alone, the stricter outcome, and says so in its hint."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from coding_agent_env.cli.main import load_task
from coding_agent_env.models import RolloutRequest, RolloutStatus
from coding_agent_env.rollout import run_rollout
from tests.backends.conftest import Target

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "binary_search.yaml"
GUARDED = {"local": True, "local-unisolated": True, "local-landlock": True, "docker": True, "docker-exec": True,
           "hf": False, "e2b-fake": False}
"""Whether each backend kind shows the guard (local-unisolated: as root, each sandbox has a uid of its own;
local-landlock: its Landlock domain reads the guard and writes nothing there, whatever the uid)."""
SHAPES = [
    "python3 -c 'import search; assert search.binary_search([1, 3, 9], 9) == 2'",
    "python3 -m unittest -q test_search",
    "mkdir -p runtime && cp search.py runtime/ && printf 'import search, json\\nassert search.binary_search([2, 4],"
    " 4) == json.loads(\"1\")\\n' > runtime/run.py && cd / && python3 \"$OLDPWD/runtime/run.py\"",
]
PLANT_JSON = "printf 'import os\\nos._exit(0)\\n' > json.py && cp json.py runtime/ 2>/dev/null; true"
REWRITE_GUARD = (
    'test -n "$PYTHONPATH" || exit 1; printf "import os\\nos._exit(0)\\n" > "$PYTHONPATH/sitecustomize.py" && exit 0; '
    'printf x > "$PYTHONPATH/json.py" && exit 0; chmod 777 "$PYTHONPATH" && exit 0; '
    'mv "$PYTHONPATH" "$PYTHONPATH.x" && exit 0; exit 1'
)
"""Verify command 1 as an artifact's code: exit 0 when any way of changing the guard worked."""
CHECK_AFTER = "python3 -c 'import sys, search; sys.exit(1)'"
"""Verify command 2: exits 1 unless a rewritten guard (`os._exit(0)`) ran first."""


def in_workspace(sandbox: str, **update: object) -> RolloutRequest:
    task = load_task(str(EXAMPLE))
    return task.model_copy(update={"sandbox": sandbox, "artifacts": [], "verify_files": {}, **update})


@pytest.mark.parametrize("kind", list(GUARDED))
async def test_natural_shapes_import_the_agents_modules_where_the_guard_is(
    kind: str, backend_for: Callable[[str], Target], assert_no_leftovers: None
) -> None:
    name, settings, backends = backend_for(kind)
    task = in_workspace(name, verify=SHAPES)
    result = await run_rollout(task, settings=settings, backends=backends)
    assert result.status is RolloutStatus.COMPLETED, result.error
    if GUARDED[kind]:
        assert result.reward == 1.0, result.verify_results
        planted = task.model_copy(update={"solution": [*task.solution, "mkdir -p runtime", PLANT_JSON],
                                          "verify": [SHAPES[2]]})
        hacked = await run_rollout(planted, settings=settings, backends=backends)
        assert hacked.reward == 1.0, hacked.verify_results  # the standard library's json, not the plant's exit
    else:
        assert result.reward == 0.0 and "no path guard" in (result.reward_note or ""), result.verify_results


@pytest.mark.parametrize("kind", [kind for kind, guarded in GUARDED.items() if guarded])
async def test_verify_command_one_cannot_change_the_guard_for_command_two(
    kind: str, backend_for: Callable[[str], Target], assert_no_leftovers: None
) -> None:
    name, settings, backends = backend_for(kind)
    result = await run_rollout(in_workspace(name, verify=[REWRITE_GUARD, CHECK_AFTER]), settings=settings,
                               backends=backends)
    assert result.status is RolloutStatus.COMPLETED, result.error
    assert [r.exit_code for r in result.verify_results] == [1, 1], result.verify_results


@pytest.mark.parametrize("kind", ["local", "docker"])
async def test_root_verify_cannot_change_the_guard_either(
    kind: str, backend_for: Callable[[str], Target], assert_no_leftovers: None
) -> None:
    """Harbor's default verifier user is root (of the sandbox's user namespace; of the container): the guard is a
    read-only mount there, which root without CAP_SYS_ADMIN cannot make writable."""
    name, settings, backends = backend_for(kind)
    task = in_workspace(name, verify=[REWRITE_GUARD, CHECK_AFTER], verify_user="root")
    result = await run_rollout(task, settings=settings, backends=backends)
    assert result.status is RolloutStatus.COMPLETED, result.error
    assert [r.exit_code for r in result.verify_results] == [1, 1], result.verify_results
