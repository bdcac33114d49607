"""Sandbox backends by name, imported lazily so optional SDKs are only needed when enabled.

`get_backend(name, settings)` returns the process-wide backend instance, building it on first use.
A name that is not enabled in `Settings.sandbox_backends` is refused (`UnknownBackendError`): which
backends exist is the operator's choice, a request only picks among them.
"""

from __future__ import annotations

import importlib
import threading

from coding_agent_env.errors import MissingExtraError, UnknownBackendError
from coding_agent_env.sandbox.base import SandboxBackend
from coding_agent_env.settings import Settings

__all__ = ["BACKENDS", "get_backend", "resolve_backend_name"]

BACKENDS: dict[str, tuple[str, str | None]] = {
    "local": ("coding_agent_env.sandbox.local:LocalBackend", None),
    "docker": ("coding_agent_env.sandbox.docker:DockerBackend", "docker"),
    "hf": ("coding_agent_env.sandbox.hf:HfBackend", "hf"),
    "e2b": ("coding_agent_env.sandbox.e2b:E2bBackend", "e2b"),
}
"""name -> (import path of the backend class, the pip extra its SDK comes with)."""

_instances: dict[tuple[str, str], SandboxBackend] = {}
_lock = threading.Lock()


def resolve_backend_name(requested: str | None, settings: Settings) -> str:
    """The backend a request gets: its own pick if enabled, else the server's default."""
    name = requested or settings.default_backend
    if name not in settings.sandbox_backends:
        enabled = ", ".join(settings.sandbox_backends)
        raise UnknownBackendError(f"sandbox backend {name!r} is not enabled on this server (enabled: {enabled})")
    if name not in BACKENDS:
        raise UnknownBackendError(f"unknown sandbox backend {name!r} (known: {', '.join(BACKENDS)})")
    return name


def get_backend(name: str, settings: Settings) -> SandboxBackend:
    """The backend instance for `name` under `settings`, imported and built on first use."""
    name = resolve_backend_name(name, settings)
    key = (name, settings.model_dump_json())  # equal settings share one backend instance
    with _lock:
        backend = _instances.get(key)
        if backend is None:
            backend = _load(name)(settings)
            _instances[key] = backend
        return backend


def _load(name: str) -> type[SandboxBackend]:
    target, extra = BACKENDS[name]
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if extra is None or exc.name == module_name:
            raise
        raise MissingExtraError(name, extra) from exc
    backend_cls: type[SandboxBackend] = getattr(module, attr)
    return backend_cls
