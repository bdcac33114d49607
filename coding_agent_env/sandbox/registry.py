"""`Backends`: the sandbox backends one app (or one call) uses, built lazily from its settings.

Which backends exist is the operator's choice (`Settings.backends`); a request only picks among them, by name
(`resolve`). Each backend is imported and built on first use (`get`), so an optional SDK is only needed when
its backend is enabled and used, and a missing one is a `MissingExtraError` naming the extra to install.

It also holds the groups' set-up templates (`templates`): a group's members share one, whichever backend made
it, for as long as the `Backends` lives.

Whoever builds a `Backends` owns it and closes it (`aclose`, or `async with`): the app for its lifetime, a
rollout run without one for that rollout. Tests pass ready-made backends as `overrides` instead of patching.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Mapping
from typing import Any

from coding_agent_env.errors import BackendRefusedError, MissingExtraError
from coding_agent_env.sandbox.base import SandboxBackend
from coding_agent_env.sandbox.templates import GroupTemplates, TemplateBounds
from coding_agent_env.settings import Settings

__all__ = ["BACKEND_CLASSES", "Backends", "import_backend"]

BACKEND_CLASSES: Mapping[str, tuple[str, str | None]] = {
    "local": ("coding_agent_env.sandbox.local:LocalBackend", None),
    "docker": ("coding_agent_env.sandbox.docker:DockerBackend", "docker"),
    "hf": ("coding_agent_env.sandbox.remote.hf:HfBackend", "hf"),
    "e2b": ("coding_agent_env.sandbox.remote.e2b:E2bBackend", "e2b"),
    "k8s": ("coding_agent_env.sandbox.remote.k8s:K8sBackend", "k8s"),
}
"""name -> (import path of the backend class, the pip extra its SDK comes with)."""


def import_backend(target: str, name: str, extra: str | None) -> Any:
    """The class at `target` (`module:attr`); `MissingExtraError(name, extra)` when a module it imports is
    missing (its SDK is not installed)."""
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if extra is None or exc.name == module_name:
            raise
        raise MissingExtraError(name, extra) from exc
    return getattr(module, attr)


class Backends:
    """The enabled backends under `settings`, by name; thread-safe. `overrides` are used as they are for their
    names (which must be enabled) instead of being built; they are closed with the rest."""

    def __init__(self, settings: Settings, *, overrides: Mapping[str, SandboxBackend] | None = None) -> None:
        self.settings = settings
        self._built: dict[str, SandboxBackend] = {}
        self._lock = threading.Lock()
        self.templates = GroupTemplates(TemplateBounds.from_settings(settings))
        """The groups' set-up templates made from these backends, bounded by the settings (`TemplateBounds`);
        released by `aclose`, before the backends."""
        for name, backend in (overrides or {}).items():
            settings.backend_config(name)  # enabled, or UnknownBackendError
            self._built[name] = backend

    @property
    def names(self) -> tuple[str, ...]:
        """The enabled backends, the default first."""
        return self.settings.sandbox_backends

    def resolve(self, requested: str | None) -> str:
        """The backend a request gets: its own pick if enabled, else the default; `UnknownBackendError`."""
        name = requested or self.settings.default_backend
        self.settings.backend_config(name)
        return name

    def get(self, name: str) -> SandboxBackend:
        """The backend `name`, imported and built on first use; `UnknownBackendError` if not enabled,
        `MissingExtraError` if its SDK is missing."""
        config = self.settings.backend_config(name)
        with self._lock:
            backend = self._built.get(name)
            if backend is None:
                target, extra = BACKEND_CLASSES[name]
                backend = import_backend(target, name, extra)(config, self.settings)
                self._built[name] = backend
            return backend

    async def check_usable(self, name: str, network: str | None = None) -> None:
        """`BackendRefusedError` (a request error: nothing was made) when backend `name` will make no sandbox
        on this host as configured (its SDK missing, say), or none with network policy `network`, saying how to
        fix it."""
        try:
            backend = self.get(name)
        except MissingExtraError as exc:
            raise BackendRefusedError(str(exc)) from exc
        reason = await backend.refusal()
        if reason is None and network is not None:
            reason = backend.network_refusal(network)
        if reason is not None:
            raise BackendRefusedError(f"sandbox backend {name!r} refuses: {reason}")

    async def aclose(self) -> None:
        """Release the groups' templates, then every backend built or given (their clients); sandboxes are their
        creators' to close."""
        await self.templates.aclose()
        with self._lock:
            built, self._built = list(self._built.values()), {}
        for backend in built:
            await backend.aclose()

    async def __aenter__(self) -> Backends:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
