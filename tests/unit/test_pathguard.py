"""The path guard (`sandbox/pathguard/sitecustomize.py`) run by real interpreters, without a sandbox: the shapes
natural verify commands take import the workdir's modules, and nothing planted there shadows the standard
library or an installed package. Each interpreter runs as hardened verify runs it (PYTHONSAFEPATH=1,
PYTHONNOUSERSITE=1, PYTHONPATH naming only the guard's directory). The sandbox's part (the directory read-only
to every process there) is tested on the local backend in tests/e2e/test_verify_hardening.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from coding_agent_env.sandbox import pathguard
from coding_agent_env.sandbox.local.launch import GUARD_MOUNT, Bwrap, Unisolated
from coding_agent_env.verify_env import hardened_overlay

SYSTEM_PYTHON = "/usr/bin/python3"
"""The Python a local sandbox runs (bubblewrap shows the host's /usr): Debian's, with its own sitecustomize."""
PYTHONS = [sys.executable] + ([SYSTEM_PYTHON] if Path(SYSTEM_PYTHON).exists() else [])
"""This test's interpreter (with pytest installed) and the system's (without)."""
TIMEOUT_S = 60


@pytest.fixture
def guard(tmp_path: Path) -> Path:
    return pathguard.install(tmp_path / "state")


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A workdir with the agent's module `m`, a unittest module `test_x` using it, and a script directory whose
    script imports its sibling."""
    work = tmp_path / "work"
    (work / "runtime").mkdir(parents=True)
    (work / "m.py").write_text("X = 41 + 1\n")
    (work / "test_x.py").write_text("import unittest\nimport m\n\n\nclass T(unittest.TestCase):\n"
                                    "    def test_x(self):\n        self.assertEqual(m.X, 42)\n")
    (work / "runtime" / "registry.py").write_text("SOURCES = ['a', 'b']\n")
    (work / "runtime" / "run.py").write_text("import registry\nprint(','.join(registry.SOURCES))\n")
    return work


def run(python: str, args: list[str], cwd: Path, guard: Path | None, **env: str) -> subprocess.CompletedProcess[str]:
    base = {"PATH": "/usr/bin:/bin", "PYTHONSAFEPATH": "1", "PYTHONNOUSERSITE": "1",
            "PYTHONPATH": str(guard) if guard is not None else ""}
    return subprocess.run([python, *args], cwd=cwd, env={**base, **env}, capture_output=True, text=True,
                          timeout=TIMEOUT_S, check=False)


NATURAL = {
    "import-in-workdir": ["-c", "import m; assert m.X == 42"],
    "unittest-module": ["-m", "unittest", "-q", "test_x"],
    "script-sibling": ["runtime/run.py"],
}


@pytest.mark.parametrize("python", PYTHONS)
@pytest.mark.parametrize("shape", list(NATURAL))
def test_natural_verify_shapes_import_the_agents_modules(python: str, shape: str, guard: Path, work: Path) -> None:
    done = run(python, NATURAL[shape], work, guard)
    assert done.returncode == 0, done.stderr
    without = run(python, NATURAL[shape], work, None)  # the safe path alone (today's hardening): the cost
    assert without.returncode != 0 and "No module named" in without.stderr


@pytest.mark.parametrize("python", PYTHONS)
def test_stdin_imports_from_the_current_directory(python: str, guard: Path, work: Path) -> None:
    done = subprocess.run([python, "-"], input="import m\nprint(m.X)\n", cwd=work, capture_output=True, text=True,
                          env={"PYTHONSAFEPATH": "1", "PYTHONPATH": str(guard)}, timeout=TIMEOUT_S, check=False)
    assert done.stdout == "42\n", done.stderr


PLANTS = {
    "json.py": "import os\nos._exit(0)\n",
    "unittest/__init__.py": "import os\nos._exit(0)\n",
    "unittest/__main__.py": "import os\nos._exit(0)\n",
}


@pytest.mark.parametrize("python", PYTHONS)
@pytest.mark.parametrize("where", [".", "runtime"])
def test_planted_stdlib_names_shadow_nothing(python: str, where: str, guard: Path, work: Path) -> None:
    for name, text in PLANTS.items():
        (work / where / name).parent.mkdir(exist_ok=True)
        (work / where / name).write_text(text)
    (work / "runtime" / "run.py").write_text("import json, registry\nraise SystemExit(json.loads('7'))\n")
    (work / "test_x.py").write_text("import unittest, json\n\n\nclass T(unittest.TestCase):\n"
                                    "    def test_x(self):\n        self.fail('the verifier ran')\n")
    assert run(python, ["-m", "unittest", "-q", "test_x"], work, guard).returncode == 1
    assert run(python, ["-c", "import json; raise SystemExit(json.loads('3'))"], work, guard).returncode == 3
    assert run(python, ["runtime/run.py"], work, guard).returncode == 7
    control = run(python, ["-c", "import json; raise SystemExit(3)"], work / where, guard, PYTHONSAFEPATH="")
    assert control.returncode == 0  # Python's default (the directory first): the plant runs


def test_a_planted_pytest_shadows_no_installed_pytest(guard: Path, work: Path) -> None:
    """This interpreter has pytest: `python3 -m pytest` runs it (the agent's test passes), never a plant."""
    (work / "test_m.py").write_text("import m\n\n\ndef test_m():\n    assert m.X == 42\n")
    honest = run(sys.executable, ["-m", "pytest", "-q", "-p", "no:cacheprovider", "test_m.py"], work, guard)
    assert honest.returncode == 0 and "1 passed" in honest.stdout, honest.stdout + honest.stderr
    (work / "pytest.py").write_text("import os\nos._exit(0)\n")
    (work / "test_m.py").write_text("def test_m():\n    assert False\n")
    hacked = run(sys.executable, ["-m", "pytest", "-q", "-p", "no:cacheprovider", "test_m.py"], work, guard)
    assert hacked.returncode == 1 and "1 failed" in hacked.stdout, hacked.stdout + hacked.stderr
    control = run(sys.executable, ["-m", "pytest", "test_m.py"], work, guard, PYTHONSAFEPATH="")
    assert control.returncode == 0  # without the safe path the plant is what runs


@pytest.mark.skipif(not Path("/usr/lib/python3.11/sitecustomize.py").exists(), reason="no system sitecustomize")
def test_the_systems_sitecustomize_still_runs_and_no_plant_stands_in(guard: Path, work: Path) -> None:
    """Debian's sitecustomize imports `apport_python_hook` if present: the guard runs it before the workdir is on
    the path, so a planted one (or a planted sitecustomize) never runs at start-up."""
    for name in ("apport_python_hook.py", "sitecustomize.py"):
        (work / name).write_text("import os\nos._exit(0)\n")
    done = run(SYSTEM_PYTHON, ["-c", "import sitecustomize, sys; print(sitecustomize.__file__); sys.exit(5)"],
               work, guard)
    assert done.returncode == 5 and done.stdout == "/usr/lib/python3.11/sitecustomize.py\n", done.stderr


@pytest.mark.parametrize("python", PYTHONS)
def test_the_path_is_the_safe_one_with_the_directory_last(python: str, guard: Path, work: Path) -> None:
    probe = "import sys; print(repr(sys.path))"
    guarded = eval(run(python, ["-c", probe], work, guard).stdout)  # noqa: S307 - our own repr of a list of str
    plain = eval(run(python, ["-c", probe], work, None).stdout)  # noqa: S307
    assert guarded == [*plain, ""] and str(guard) not in guarded
    unset = eval(run(python, ["-c", probe], work, guard, PYTHONSAFEPATH="").stdout)  # noqa: S307
    assert unset.count("") == 1 and unset[0] == ""  # Python's own first entry, never a second one


@pytest.mark.parametrize("argv", [["/nonexistent/x.py"], ["-c", "pass", "\udcff"]])
def test_the_guard_never_fails_a_start(argv: list[str], guard: Path, work: Path) -> None:
    done = run(sys.executable, argv, work, guard)
    assert "Error in sitecustomize" not in done.stderr and "Traceback" not in done.stderr.split("can't open")[0]


def test_install_is_read_only_to_others_and_reused(tmp_path: Path) -> None:
    first = pathguard.install(tmp_path)
    assert first.parent == tmp_path / pathguard.STATE_SUBDIR and pathguard.install(tmp_path) == first
    assert (first.stat().st_mode & 0o777, (first / pathguard.HOOK).stat().st_mode & 0o777) == (0o755, 0o644)
    assert [p.name for p in first.iterdir()] == [pathguard.HOOK] and os.listdir(first.parent) == [first.name]


def test_the_overlay_names_the_guard_alone() -> None:
    overlay = hardened_overlay({"PYTHONPATH": "/opt/lib"}, ("/workspace", "/tmp"), fallback_path="/usr/bin",
                               guard="/run/verify-site")
    assert overlay["PYTHONPATH"] == "/run/verify-site" and overlay["PYTHONSAFEPATH"] == "1"
    for bad in ("", "g", "/run/a:/tmp"):
        with pytest.raises(ValueError, match="path guard"):
            hardened_overlay({}, ("/workspace", "/tmp"), fallback_path="/usr/bin", guard=bad)


def test_where_each_local_mode_shows_the_guard() -> None:
    """bubblewrap: its read-only mount; unisolated: the host directory itself, only for a sandbox uid of its own
    (commands running as the server's own user could rewrite it: no guard then, the safe path alone)."""
    source = Path("/state/pathguard/abc")
    assert Bwrap("probe", "/usr/bin/bwrap", ()).path_guard(source, None) == GUARD_MOUNT
    unisolated = Unisolated("probe")
    assert unisolated.path_guard(source, None) is None
    assert unisolated.path_guard(source, os.geteuid()) is None
    assert unisolated.path_guard(source, os.geteuid() + 1) == str(source)


def test_an_unisolated_guard_under_a_state_dir_with_a_colon_is_none_not_a_failed_verify() -> None:
    """A host directory with `:` in it cannot be PYTHONPATH's one entry (`hardened_overlay` refuses it, and every
    verify would end in an infrastructure error): unisolated then shows no guard, and verify keeps the safe path."""
    assert Unisolated("probe").path_guard(Path("/srv/cae:1/pathguard/abc"), os.geteuid() + 1) is None


@pytest.mark.parametrize("hook", ["raise RuntimeError('broken hook')\n", "import no_such_module_anywhere\n"])
def test_a_failing_system_sitecustomize_is_reported_as_python_would(hook: str, tmp_path: Path, guard: Path,
                                                                    work: Path) -> None:
    """A virtualenv whose own sitecustomize fails: the same message site.py prints without the guard, and the
    guard still applies."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=TIMEOUT_S)
    (site,) = venv.glob("lib/python3*/site-packages")
    (site / "sitecustomize.py").write_text(hook)
    python = str(venv / "bin" / "python")
    guarded = run(python, ["-c", "import m; print(m.X)"], work, guard)
    plain = run(python, ["-c", "print(42)"], work, None)
    assert guarded.stdout == plain.stdout == "42\n"
    assert guarded.stderr == plain.stderr and plain.stderr.startswith("Error in sitecustomize"), plain.stderr
