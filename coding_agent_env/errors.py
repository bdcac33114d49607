"""Typed errors, named after the boundary they cross.

    CodingAgentEnvError
    ├── SettingsError            operator configuration is invalid
    ├── RequestError             the caller asked for something this server will not do
    │   ├── UnknownAgentError        agent not registered here
    │   ├── UnknownBackendError      sandbox backend not enabled here
    │   ├── BackendRefusedError      sandbox backend makes no sandbox here as configured (no isolation, no opt-in)
    │   ├── InvalidTaskError         a task file could not be read or parsed
    │   └── EndpointError            the request's LLM endpoint cannot be used as asked
    │       └── UnknownEndpointError     endpoint name not in the server's catalog
    ├── SandboxError             the sandbox boundary (provision, exec, files, close)
    │   ├── SandboxUnavailableError  a backend's engine or SDK is missing
    │   │   └── MissingExtraError        the backend's Python extra is not installed
    │   ├── SandboxClosedError       used after close
    │   └── SandboxFileError         a file operation failed or left the sandbox
    │       ├── SandboxFileNotFoundError
    │       └── SandboxFileNotRegularError  exists but is not a regular file (counts as absent)
    ├── AgentError               the agent boundary (start, run)
    ├── RelayError               the server-side LLM relay (listeners, leases)
    │   └── LeaseClosedError         a lease was used after it was closed
    └── GateError                the trainer-side gate (register, next_request, deliver)
        ├── UnknownRolloutError      no such rollout is registered
        ├── RolloutClosedError       the rollout exited or was unregistered while waited on
        ├── UnknownRequestError      the request is no longer waiting for an answer
        ├── InvalidResponseError     a delivered response is not a chat completion
        └── GateTimeoutError         next_request saw no request in time (also a TimeoutError)

Protocol-plane errors (`RequestError`) are raised to the caller; everything that goes wrong while a rollout
runs is reported as data in `RolloutResult.error` with the class name as its `type`.
Messages never contain secrets.
"""

from __future__ import annotations

__all__ = [
    "AgentError",
    "BackendRefusedError",
    "CodingAgentEnvError",
    "EndpointError",
    "GateError",
    "GateTimeoutError",
    "InvalidResponseError",
    "InvalidTaskError",
    "LeaseClosedError",
    "MissingExtraError",
    "RelayError",
    "RequestError",
    "RolloutClosedError",
    "SandboxClosedError",
    "SandboxStartError",
    "SandboxUnsupportedError",
    "SandboxError",
    "SandboxFileError",
    "SandboxFileNotFoundError",
    "SandboxFileNotRegularError",
    "SandboxUnavailableError",
    "SettingsError",
    "UnknownAgentError",
    "UnknownBackendError",
    "UnknownEndpointError",
    "UnknownRequestError",
    "UnknownRolloutError",
]


class CodingAgentEnvError(Exception):
    """Base of every error this package raises on purpose."""


class SettingsError(CodingAgentEnvError):
    """The operator's configuration is invalid."""


class RequestError(CodingAgentEnvError):
    """The caller asked for something this server will not do; nothing was started."""


class UnknownAgentError(RequestError):
    """The requested agent is not registered (or not runnable) on this server."""


class UnknownBackendError(RequestError):
    """The requested sandbox backend is not enabled on this server."""


class BackendRefusedError(RequestError):
    """The requested sandbox backend will make no sandbox on this host as configured (e.g. no isolation and no
    opt-in to running unisolated); the message says how to fix it."""


class InvalidTaskError(RequestError):
    """A task file could not be read or does not describe a valid request."""


class SandboxError(CodingAgentEnvError):
    """A sandbox operation failed (provision, exec, file transfer, close)."""


class SandboxUnavailableError(SandboxError):
    """A backend cannot run here: its engine, binary or credentials are missing."""


class MissingExtraError(SandboxUnavailableError):
    """A backend's optional Python dependency is not installed."""

    def __init__(self, backend: str, extra: str) -> None:
        super().__init__(f"sandbox backend {backend!r} needs: pip install 'coding-agent-env[{extra}]'")
        self.backend = backend
        self.extra = extra


class SandboxUnsupportedError(SandboxError):
    """The backend cannot give the sandbox a task asks for (its workdir, its users, a directory it claims): the
    task is refused before anything runs, naming the setting (`setting`), never run otherwise."""

    def __init__(self, backend: str, setting: str, detail: str) -> None:
        super().__init__(f"sandbox backend {backend!r} cannot honour the task's {setting}: {detail}")
        self.backend = backend
        self.setting = setting


class SandboxClosedError(SandboxError):
    """The sandbox was used after it was closed."""


class SandboxStartError(SandboxError):
    """The sandbox's own plumbing failed before a command started (a bind or mount bubblewrap could not make, a
    launcher that could not run): an infrastructure fault, never the command's exit status."""


class SandboxFileError(SandboxError):
    """A file operation failed or would have left the sandbox."""


class SandboxFileNotFoundError(SandboxFileError):
    """The file does not exist in the sandbox."""


class SandboxFileNotRegularError(SandboxFileError):
    """The path exists in the sandbox but is not a regular file (a FIFO, socket, device, directory or a symlink
    where one is not followed): sandbox output of that kind is untrusted and counts as absent."""


class AgentError(CodingAgentEnvError):
    """The agent could not be started or run (not its task outcome: that is the exit code)."""


class EndpointError(RequestError):
    """The request's LLM endpoint cannot be used as asked (missing key or model, bad URL, key redirect)."""


class UnknownEndpointError(EndpointError):
    """The requested endpoint name is not in the server's catalog."""


class RelayError(CodingAgentEnvError):
    """The server-side LLM relay could not start, or was used outside its lifecycle."""


class LeaseClosedError(RelayError):
    """A relay lease was used after it was closed (its token is revoked)."""


class GateError(CodingAgentEnvError):
    """The trainer-side gate refused an operation."""


class UnknownRolloutError(GateError):
    """No rollout with this id is registered with the gate."""


class RolloutClosedError(GateError):
    """The rollout exited or was unregistered; nothing more will come from it."""


class UnknownRequestError(GateError):
    """The request is not waiting for an answer (already answered, abandoned by its client, or unregistered)."""


class InvalidResponseError(GateError):
    """A delivered response is not a chat completion the gate can return."""


class GateTimeoutError(GateError, TimeoutError):
    """`next_request` saw no request within its timeout."""
