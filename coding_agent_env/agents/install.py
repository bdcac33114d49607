"""Installing CLI agents once into the shared prefix, and checking what is installed.

Layout: `<agents_dir>/<name>-<version>/` holds one agent's npm installs (`npm install --prefix`) and virtualenvs
(made by a system interpreter, then `pip install` of the pinned packages), and a `.installed.json` marker written
last, listing the exact packages. An install goes to a temporary sibling
directory that is renamed into place when complete, so a prefix is either whole or absent. Nothing here
runs per rollout: `coding-agent-env agents install` (and `.ci/run`) call it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from coding_agent_env.agents.spec import CliAgentSpec, NpmInstall, PipInstall
from coding_agent_env.errors import AgentError

__all__ = [
    "INSTALL_COMMAND",
    "AgentInstallError",
    "AgentNotInstalledError",
    "InstallStatus",
    "check_installed",
    "install",
    "status",
]

INSTALL_COMMAND = "coding-agent-env agents install"
MARKER = ".installed.json"
NPM_TIMEOUT_S = 900.0
"""One `npm install` (or `pip install`) may take this long (a cold cache on a slow link) before it is killed."""


class AgentNotInstalledError(AgentError):
    """The agent's pinned version is not installed where this server looks for it."""


class AgentInstallError(AgentError):
    """`npm install` or `pip install` failed, or npm is not available."""


@dataclass(frozen=True)
class InstallStatus:
    name: str
    version: str
    installed: bool
    path: str | None
    detail: str


def prefix_of(spec: CliAgentSpec, agents_dir: Path) -> Path:
    return agents_dir / spec.prefix_name


def _marker(spec: CliAgentSpec) -> dict[str, object]:
    packages = [p.pinned for i in spec.installs for p in i.packages]
    return {"agent": spec.name, "version": spec.version, "packages": packages}


def _installed_package_version(spec: CliAgentSpec, prefix: Path, package: str) -> str | None:
    for step in spec.installs:
        if isinstance(step, PipInstall) and any(p.name == package for p in step.packages):
            return _pip_version(prefix / step.subdir, package)
    try:
        data = json.loads((prefix / "node_modules" / package / "package.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    version = data.get("version") if isinstance(data, dict) else None
    return version if isinstance(version, str) else None


def _pip_version(venv: Path, package: str) -> str | None:
    """The version of `package` in the virtualenv, from its dist-info directory name."""
    normal = package.replace("-", "_").lower()
    for info in venv.glob("lib/python*/site-packages/*.dist-info"):
        name, _, version = info.name[: -len(".dist-info")].rpartition("-")
        if name.replace("-", "_").lower() == normal:
            return version
    return None


def status(spec: CliAgentSpec, agents_dir: Path) -> InstallStatus:
    """Whether the spec's exact packages are installed under `agents_dir` (no side effects)."""
    if not spec.needs_install:
        return InstallStatus(spec.name, spec.version, True, None, "built in")
    prefix = prefix_of(spec, agents_dir)
    try:
        marker = json.loads((prefix / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return InstallStatus(spec.name, spec.version, False, None, f"not installed (run `{INSTALL_COMMAND}`)")
    if marker != _marker(spec):
        return InstallStatus(spec.name, spec.version, False, str(prefix), f"stale install (run `{INSTALL_COMMAND}`)")
    if spec.version_package is not None:
        found = _installed_package_version(spec, prefix, spec.version_package)
        if found != spec.version:
            detail = f"{spec.version_package} is {found or 'missing'}, want {spec.version} (run `{INSTALL_COMMAND}`)"
            return InstallStatus(spec.name, spec.version, False, str(prefix), detail)
    return InstallStatus(spec.name, spec.version, True, str(prefix), "installed")


def check_installed(spec: CliAgentSpec, agents_dir: Path) -> None:
    """Raise `AgentNotInstalledError` naming the install command unless the spec is installed."""
    found = status(spec, agents_dir)
    if not found.installed:
        raise AgentNotInstalledError(
            f"agent {spec.name} {spec.version} is not installed in {agents_dir}: {found.detail}"
        )


def install(spec: CliAgentSpec, agents_dir: Path, *, npm: str = "npm") -> InstallStatus:
    """Install the spec's pinned packages unless already installed. Idempotent; raises `AgentInstallError`."""
    current = status(spec, agents_dir)
    if current.installed:
        return current
    npm_path = shutil.which(npm) or ""
    if not npm_path and any(isinstance(step, NpmInstall) for step in spec.installs):
        raise AgentInstallError(f"cannot install {spec.name}: `{npm}` is not on PATH (install node and npm)")
    agents_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(agents_dir, 0o755)  # sandboxes run as other uids and must read it
    staging = Path(tempfile.mkdtemp(prefix=f".{spec.prefix_name}-", dir=agents_dir))
    try:
        for step in spec.installs:
            if isinstance(step, PipInstall):
                _pip_install(step, staging / step.subdir)
            else:
                _npm_install(npm_path, staging / step.subdir, [p.pinned for p in step.packages])
        (staging / MARKER).write_text(json.dumps(_marker(spec)), encoding="utf-8")
        os.chmod(staging, 0o755)
        final = prefix_of(spec, agents_dir)
        if final.exists():
            shutil.rmtree(final)
        staging.rename(final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return status(spec, agents_dir)


def _npm_install(npm: str, prefix: Path, packages: list[str]) -> None:
    prefix.mkdir(parents=True, exist_ok=True)
    argv = [npm, "install", "--no-audit", "--no-fund", "--no-update-notifier", "--prefix", str(prefix), *packages]
    what = f"npm install {' '.join(packages)}"
    _run(argv, failed=what, exited=what)


def _pip_install(step: PipInstall, venv: Path) -> None:
    """A virtualenv made by the step's system interpreter, with the pinned packages (and their dependencies)."""
    packages = [p.pinned for p in step.packages]
    for argv in (
        [step.python, "-m", "venv", str(venv)],
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", *packages],
    ):
        _run(argv, failed=f"pip install {' '.join(packages)}", exited=" ".join(argv[:4]))


def _run(argv: list[str], *, failed: str, exited: str) -> None:
    """Run one install step (bounded by `NPM_TIMEOUT_S`); `AgentInstallError` saying "`failed` failed" when it
    cannot run, "`exited` exited N" with its stderr's tail when it fails."""
    try:
        done = subprocess.run(argv, capture_output=True, timeout=NPM_TIMEOUT_S, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise AgentInstallError(f"{failed} failed: {exc}") from exc
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-5:]
        raise AgentInstallError(f"{exited} exited {done.returncode}: {' | '.join(tail)}")
