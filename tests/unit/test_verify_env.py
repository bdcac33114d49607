"""verify_env's rules without a sandbox, and the bundled verifiers' shape (docs/concepts/integrity.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from coding_agent_env.api.ui.presets import PRESETS
from coding_agent_env.cli.main import load_task
from coding_agent_env.models import RolloutRequest
from coding_agent_env.verify_env import CLEARED_FOR_VERIFY, hardened_overlay, workspace_entry

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "binary_search.yaml"
ROOTS = ("/workspace", "/tmp", "/box/work")


@pytest.mark.parametrize(("name", "value", "problem"), [
    ("PATH", "/usr/bin:/bin", None),
    ("PATH", "/opt/task/bin:/usr/bin", None),
    ("PATH", "/usr/bin::/bin", "PATH entry '' is empty"),
    ("PATH", "/usr/bin:.", "PATH entry '.' is relative"),
    ("PATH", "~/bin:/usr/bin", "PATH entry '~/bin' is relative"),
    ("PATH", "/usr/../workspace/bin", "PATH entry '/usr/../workspace/bin' is inside /workspace"),
    ("PATH", "/workspacex/bin", None),
    ("LD_PRELOAD", "/usr/lib/a.so /tmp/b.so", "LD_PRELOAD entry '/tmp/b.so' is inside /tmp"),
    ("PYTHONPATH", "", None),
    ("GREETING", "/workspace", None),
])
def test_workspace_entry(name: str, value: str, problem: str | None) -> None:
    found = workspace_entry(name, value, ROOTS)
    assert (found is None) if problem is None else (found is not None and found.startswith(problem)), found


def test_the_overlay_empties_injecting_variables_and_filters_search_paths() -> None:
    base = {"PATH": "/box/work/.venv/bin:/opt/bin:bin:/usr/bin", "PYTHONPATH": "/opt/lib", "LD_PRELOAD": "/x.so",
            "NODE_PATH": "/tmp/n:/opt/n", "PERL5LIB": "/opt/perl", "HOME": "/home/sandbox"}
    overlay = hardened_overlay(base, ROOTS, fallback_path="/usr/bin:/bin")
    assert overlay == {"PYTHONSAFEPATH": "1", "PYTHONNOUSERSITE": "1", "PYTHONPATH": "", "LD_PRELOAD": "",
                       "PATH": "/opt/bin:/usr/bin", "NODE_PATH": "/opt/n"}


def test_a_path_with_nothing_left_falls_back() -> None:
    overlay = hardened_overlay({"PATH": "/workspace/bin"}, ROOTS, fallback_path="/usr/bin:/bin")
    assert overlay["PATH"] == "/usr/bin:/bin"


def test_the_brief_set_is_cleared() -> None:
    assert {"PYTHONPATH", "PYTHONSTARTUP", "LD_PRELOAD", "LD_LIBRARY_PATH"} <= set(CLEARED_FOR_VERIFY)


def test_hardening_is_the_default_and_the_refusal_can_be_waived() -> None:
    assert RolloutRequest(instruction="x").verify_hardening is True
    with pytest.raises(ValueError, match=r"env PATH entry '/workspace/bin' is inside /workspace"):
        RolloutRequest(instruction="x", env={"PATH": "/workspace/bin:/usr/bin"})
    waived = RolloutRequest(instruction="x", env={"PATH": "/workspace/bin:/usr/bin"}, verify_hardening=False)
    assert waived.env["PATH"] == "/workspace/bin:/usr/bin"


def test_the_search_preset_uses_the_examples_checker() -> None:
    example = load_task(str(EXAMPLE))
    preset = PRESETS["binary_search"]
    assert preset.verify == example.verify == ["python3 -I check_search.py"]
    assert preset.verify_files == example.verify_files


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_that_runs_agent_code_judges_it_from_an_isolated_checker(name: str) -> None:
    """A verify command that runs Python runs a hidden checker in isolated mode (it imports nothing of the
    workdir); the others (shell tests on files) run no code of the agent's."""
    preset = PRESETS[name]
    for cmd in preset.verify:
        if "python3" in cmd:
            assert cmd.startswith("python3 -I ") and cmd.split()[2] in preset.verify_files, cmd
