"""Shared by backends that run commands through an engine's exec API (docker, hf, e2b).

Those backends copy `_launcher.py` (and the LLM forwarder) into the sandbox at create and run every command
through it, so that timeouts, process-tree kills, fresh HOME/TMP for verify and rlimits behave as in the
local backend. This module builds the launcher's argv, confines sandbox paths lexically, and keeps output
within its cap.
"""

from __future__ import annotations

import abc
import asyncio
import importlib.util
import json
import posixpath
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from coding_agent_env.errors import SandboxError, SandboxFileError
from coding_agent_env.sandbox.base import Process, SandboxPaths
from coding_agent_env.settings import Settings

__all__ = ["InnerLayout", "LauncherProcess", "OutputCap", "confine", "forwarder_source", "launcher_source", "rlimit_args", "run_argv"]

SANDBOX_UID = 1000
"""The unprivileged uid commands run as inside container-like sandboxes."""


@dataclass(frozen=True)
class InnerLayout:
    """Where a sandbox keeps its own machinery (root-owned, out of the sandbox user's reach where it can)."""

    base: str
    python: str = "python3"
    code: str | None = None
    """Where `launcher.py` and `forwarder.py` live (default: `base`); may be a read-only mount."""

    @property
    def launcher(self) -> str:
        return f"{self.code or self.base}/launcher.py"

    @property
    def forwarder(self) -> str:
        return f"{self.code or self.base}/forwarder.py"

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


def _source_of(module: str) -> bytes:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise SandboxError(f"cannot find {module}")
    return Path(spec.origin).read_bytes()


def launcher_source() -> bytes:
    return _source_of("coding_agent_env.sandbox._launcher")


def forwarder_source() -> bytes:
    # Read as a file, not imported: it runs inside the sandbox.
    return _source_of("coding_agent_env.llm.forwarder")


def rlimits(settings: Settings) -> dict[str, int]:
    """The rlimits the launcher sets on every command, by `prlimit` name."""
    return {
        "data": settings.sandbox_memory_mb * 1024 * 1024,
        "fsize": settings.sandbox_max_file_mb * 1024 * 1024,
        "cpu": settings.sandbox_cpu_s,
    }


def rlimit_args(settings: Settings) -> list[str]:
    args: list[str] = []
    for name, value in rlimits(settings).items():
        args += ["--rlimit", f"{name}={value}"]
    return args


def check_env(env: Mapping[str, str]) -> None:
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
    env_keys: Sequence[str] | None = None,
    env_file: str | None = None,
    fresh: bool = False,
    uid: int | None = SANDBOX_UID,
    limits: Sequence[str] = (),
    log_path: str | None = None,
) -> list[str]:
    """The launcher's `run` argv for one command. Carries variable *names* only, never values."""
    if not argv:
        raise SandboxError("empty argv")
    args = ["--token", token, "--run-dir", layout.run_dir, "--cwd", cwd]
    if timeout is not None:
        args += ["--timeout", repr(float(timeout))]
    if env_file is not None:
        args += ["--env-file", env_file]
    else:
        args += ["--env-keys", ",".join(env_keys or ())]
    if fresh:
        args += ["--fresh-base", layout.fresh_dir]
    if uid is not None:
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


def roots(paths: SandboxPaths) -> tuple[str, ...]:
    return (paths.workdir, paths.home, paths.tmp, paths.logs)


def confine(paths: SandboxPaths, path: str) -> tuple[str, str]:
    """(root, absolute normalised path) for a sandbox path; `SandboxFileError` outside the writable roots."""
    if "\x00" in path:
        raise SandboxFileError("path contains a NUL byte")
    full = posixpath.normpath(path if path.startswith("/") else posixpath.join(paths.workdir, path))
    for root in sorted(roots(paths), key=len, reverse=True):
        if full == root or full.startswith(root + "/"):
            return root, full
    raise SandboxFileError(f"{path!r} is outside the sandbox's writable directories")


def inside(paths: SandboxPaths, real: str) -> bool:
    return any(real == root or real.startswith(root + "/") for root in roots(paths))


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


class LauncherProcess(Process):
    """A background command run by the in-sandbox launcher under `token`. A backend says how its exit code is
    learnt (`_exit_code`) and how its whole tree is killed (`_kill`); the code is cached once known."""

    def __init__(self, token: str) -> None:
        self._token = token
        self._code: int | None = None

    @property
    def returncode(self) -> int | None:
        return self._code

    async def wait(self) -> int:
        if self._code is None:
            self._code = await self._exit_code()
        return self._code

    async def kill(self) -> None:
        if self._code is None:
            await asyncio.shield(self._kill())
            await asyncio.shield(self.wait())

    @abc.abstractmethod
    async def _exit_code(self) -> int:
        """Wait for the command to end; its exit code (negative for a signal)."""

    @abc.abstractmethod
    async def _kill(self) -> None:
        """Kill the command's whole tree."""
