"""Where commands run: the async sandbox contract, its backends and their registry."""

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
from coding_agent_env.sandbox.registry import get_backend, resolve_backend_name

__all__ = [
    "BackendStatus",
    "ExecResult",
    "FileEntry",
    "Process",
    "Sandbox",
    "SandboxBackend",
    "SandboxPaths",
    "SandboxSpec",
    "get_backend",
    "resolve_backend_name",
]
