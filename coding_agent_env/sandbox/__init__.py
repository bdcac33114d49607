"""Where commands run: the async sandbox contract (`base`), the backends by family (`local`, `docker`,
`remote`; `launcher` drives the sandboxes of docker and remote) and `Backends` (`registry`), which builds the
enabled ones lazily from the settings."""

from coding_agent_env.sandbox.base import (
    BackendStatus,
    ExecResult,
    FileEntry,
    Process,
    Sandbox,
    SandboxBackend,
    SandboxPaths,
    SandboxSpec,
)
from coding_agent_env.sandbox.registry import Backends

__all__ = [
    "BackendStatus",
    "Backends",
    "ExecResult",
    "FileEntry",
    "Process",
    "Sandbox",
    "SandboxBackend",
    "SandboxPaths",
    "SandboxSpec",
]
