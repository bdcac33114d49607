"""The host side of the in-sandbox launcher: its files, its argv, its status, and lexical path confinement.

Launcher-driven backends (docker, hf, e2b) copy the launcher's files (`inside/`, and the LLM forwarder) into
the sandbox at create and run every command through it, so that timeouts, process-tree kills, fresh HOME/TMP
for verify and rlimits behave as in the local backend. This module builds the launcher's argv, confines
sandbox paths lexically, and keeps output within its cap.
"""

from __future__ import annotations

import importlib.util
import json
import posixpath
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from coding_agent_env.errors import SandboxError, SandboxFileError
from coding_agent_env.sandbox.base import SandboxPaths

__all__ = [
    "INSIDE_DIR",
    "SANDBOX_UID",
    "InnerLayout",
    "OutputCap",
    "check_env",
    "confine",
    "forwarder_source",
    "inside",
    "launcher_files",
    "new_token",
    "parse_status",
    "rlimit_args",
    "roots",
    "run_argv",
]

INSIDE_DIR = Path(__file__).with_name("inside")
"""The launcher's own files (`inside/launcher.py` documents them)."""
LAUNCHER_FILES = ("launcher.py", "procs.py", "initd.py", "fileops.py", "treeops.py")
"""The launcher and the modules it imports from its own directory (see `inside/launcher.py`)."""

SANDBOX_UID = 1000
"""The unprivileged uid commands run as inside container-like sandboxes."""


@dataclass(frozen=True)
class InnerLayout:
    """Where a sandbox keeps its own machinery (root-owned, out of the sandbox user's reach where it can)."""

    base: str
    python: str = "python3"
    code: str | None = None
    """Where the launcher's files and `forwarder.py` live (default: `base`); may be a read-only mount."""

    @property
    def code_dir(self) -> str:
        return self.code or self.base

    @property
    def launcher(self) -> str:
        return f"{self.code_dir}/launcher.py"

    @property
    def forwarder(self) -> str:
        return f"{self.code_dir}/forwarder.py"

    @property
    def run_dir(self) -> str:
        return f"{self.base}/run"

    @property
    def fresh_dir(self) -> str:
        return f"{self.base}/fresh"

    def launcher_argv(self, mode: str, *args: str) -> list[str]:
        return [self.python, self.launcher, mode, *args]

    def status_path(self, token: str) -> str:
        return f"{self.run_dir}/{token}.status"


def launcher_files() -> dict[str, bytes]:
    """The launcher's files by name, to copy into one directory of a sandbox (read, never imported: they run
    inside the sandbox)."""
    try:
        return {name: (INSIDE_DIR / name).read_bytes() for name in LAUNCHER_FILES}
    except OSError as exc:
        raise SandboxError(f"cannot read the launcher's files: {exc}") from exc


def forwarder_source() -> bytes:
    """The LLM forwarder (read as a file, not imported: it runs inside the sandbox)."""
    spec = importlib.util.find_spec("coding_agent_env.llm.forwarder")
    if spec is None or spec.origin is None:
        raise SandboxError("cannot find coding_agent_env.llm.forwarder")
    return Path(spec.origin).read_bytes()


def rlimit_args(limits: Mapping[str, int]) -> list[str]:
    """The launcher's `--rlimit NAME=VALUE` arguments for `limits` (by `prlimit` name)."""
    args: list[str] = []
    for name, value in limits.items():
        args += ["--rlimit", f"{name}={value}"]
    return args


def check_env(env: Mapping[str, str]) -> None:
    """`SandboxError` for a variable name the launcher cannot carry (its names travel comma-separated)."""
    for key in env:
        if not key or "=" in key or "," in key or "\x00" in key:
            raise SandboxError(f"invalid environment variable name {key!r}")


def run_argv(
    layout: InnerLayout,
    argv: Sequence[str],
    *,
    token: str,
    cwd: str,
    timeout: float | None,
    env_args: Sequence[str],
    fresh: bool = False,
    uid: int | None = SANDBOX_UID,
    user: str | None = None,
    limits: Sequence[str] = (),
    log_path: str | None = None,
) -> list[str]:
    """The launcher's `run` argv for one command. `env_args` say where its environment comes from
    (`--env-keys K1,K2` or `--env-file F`): variable *names* or a path, never values. `user` (a name or uid,
    resolved inside the sandbox: `--user`) instead of `uid`: who the command runs as."""
    if not argv:
        raise SandboxError("empty argv")
    args = ["--token", token, "--run-dir", layout.run_dir, "--cwd", cwd]
    if timeout is not None:
        args += ["--timeout", repr(float(timeout))]
    args += env_args
    if fresh:
        args += ["--fresh-base", layout.fresh_dir]
    if user is not None:
        args += ["--user", user]
    elif uid is not None:
        args += ["--uid", str(uid)]
    if log_path is not None:
        args += ["--log", log_path]
    return layout.launcher_argv("run", *args, *limits, "--", *argv)


def new_token() -> str:
    return secrets.token_hex(12)


def parse_status(raw: bytes) -> tuple[int, bool]:
    """(negative signal number, timed_out) from a launcher status file; SandboxError if it is malformed (the
    launcher runs on the sandbox's own python3)."""
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if isinstance(data, dict) and type(data.get("signal")) is int and isinstance(data.get("timed_out"), bool):
        return -data["signal"], data["timed_out"]
    raise SandboxError(f"malformed launcher status: {raw[:100]!r}")


def roots(paths: SandboxPaths, extra: Sequence[str] = ()) -> tuple[str, ...]:
    """The sandbox's writable roots: its own (`paths`), then the task's further ones (`extra`:
    `SandboxSpec.writable_roots`)."""
    return (paths.workdir, paths.home, paths.tmp, paths.logs, *extra)


def confine(paths: SandboxPaths, path: str, extra: Sequence[str] = ()) -> tuple[str, str]:
    """(root, absolute normalised path) for a sandbox path; `SandboxFileError` outside the writable roots
    (`roots(paths, extra)`)."""
    if "\x00" in path:
        raise SandboxFileError("path contains a NUL byte")
    full = posixpath.normpath(path if path.startswith("/") else posixpath.join(paths.workdir, path))
    for root in sorted(roots(paths, extra), key=len, reverse=True):
        if full == root or full.startswith(root + "/"):
            return root, full
    raise SandboxFileError(f"{path!r} is outside the sandbox's writable directories")


def inside(paths: SandboxPaths, real: str, extra: Sequence[str] = ()) -> bool:
    return any(real == root or real.startswith(root + "/") for root in roots(paths, extra))


class OutputCap:
    """Keeps the first `cap` bytes of a stream and counts the rest."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.kept = bytearray()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        room = max(self.cap - len(self.kept), 0)
        self.kept += chunk[:room]
        self.dropped += max(len(chunk) - room, 0)
