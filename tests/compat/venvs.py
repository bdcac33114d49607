"""The side virtualenvs the compatibility tests run OpenEnv's released packages in: stdlib only, so it also runs
as a command.

    python3 -m tests.compat.venvs        # from the project root: create every one that is missing

They live under `.ci/venvs/` (gitignored), created on first use; a `.ready` marker says the install finished.
Each takes a minute or more of pip, so `.ci/run` starts this command in the background before the suite and
the installs overlap the rest of CI. Each is made under an exclusive lock of its own, so a fixture asking for
one that is being made waits for it instead of making it a second time beside it.
"""

from __future__ import annotations

import fcntl
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENVS = ROOT / ".ci" / "venvs"
INSTALL_TIMEOUT_S = 900
GEN_A = "openenv-core==0.3.0"
GEN_B = "openenv==0.10.0"
TRAINER = "trainer-openenv-0.10.0"
TRL_TRAINER = "trl-1.16"
TRL_SPECS = tuple(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["trl"])
"""What `examples/trl_grpo.py` needs beside this package, the `trl` extra: TRL's GRPOTrainer on CPU, and a GGUF model
loaded by transformers (torch comes from PyPI with its CUDA wheels, ~6 GB; it runs on CPU)."""
_UNREACHABLE = ("NewConnectionError", "Max retries exceeded", "Temporary failure in name resolution",
                "Network is unreachable", "No matching distribution found")


class IndexUnreachable(Exception):
    """pip could not reach the package index (the tests skip with it)."""


class InstallFailed(Exception):
    """pip ran and failed: the end of its output."""


def released_client(spec: str) -> Path:
    """Python of a virtualenv with `spec` installed (created once, then cached)."""
    venv = VENVS / spec.replace("==", "-")
    with _locked(venv):
        if not (venv / ".ready").exists():
            _create(venv)
            _pip(venv, spec)
            (venv / ".ready").touch()
    return venv / "bin" / "python"


def trainer(reinstall: bool = True) -> Path:
    """Python of a trainer's environment: openenv 0.10.0 and this package without its server extra, resolved
    together by pip (created once); with `reinstall`, this checkout is installed again (editable) when the
    environment already existed, so a dependency change that no longer resolves beside openenv fails."""
    venv = VENVS / TRAINER
    with _locked(venv):
        if not (venv / ".ready").exists():
            _create(venv)
            _pip(venv, GEN_B, "-e", str(ROOT))
            (venv / ".ready").touch()
        elif reinstall:
            _pip(venv, "-e", str(ROOT))
    return venv / "bin" / "python"


def trl_trainer(reinstall: bool = True) -> Path:
    """Python of a TRL trainer's environment: `TRL_SPECS` and this checkout (editable) without its server extra,
    resolved together by pip (created once); with `reinstall`, this checkout is installed again when the
    environment already existed, as for `trainer`."""
    venv = VENVS / TRL_TRAINER
    with _locked(venv):
        if not (venv / ".ready").exists():
            _create(venv)
            _pip(venv, *TRL_SPECS, "-e", str(ROOT))
            (venv / ".ready").touch()
        elif reinstall:
            _pip(venv, "-e", str(ROOT))
    return venv / "bin" / "python"


@contextmanager
def _locked(venv: Path) -> Iterator[None]:
    VENVS.mkdir(parents=True, exist_ok=True)
    with open(venv.with_name(venv.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _create(venv: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=120)


def _pip(venv: Path, *args: str) -> None:
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                           *args], capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False)
    if done.returncode != 0:
        if any(marker in done.stderr for marker in _UNREACHABLE):
            raise IndexUnreachable(f"pip cannot reach the package index to install {' '.join(args)}")
        raise InstallFailed(f"pip install {' '.join(args)} failed:\n{done.stderr[-3000:]}")


if __name__ == "__main__":
    try:
        for made in (released_client(GEN_A), released_client(GEN_B), trainer(reinstall=False),
                     trl_trainer(reinstall=False)):
            print(made)
    except (IndexUnreachable, InstallFailed, subprocess.SubprocessError) as exc:
        sys.exit(f"{type(exc).__name__}: {exc}")
