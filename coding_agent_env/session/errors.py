"""Errors of the session boundary: what a caller did wrong in managing its session.

    RequestError (coding_agent_env.errors)
    └── SessionError
        ├── CapacityError          all MAX_CONCURRENT_ENVS slots are taken
        ├── UnknownSessionError    no live session has that id
        ├── SessionAttachedError   a WebSocket is already attached to it
        ├── SessionBusyError       it is already running a rollout
        └── SessionClosedError     it is closed, or closing: it runs no more rollouts

Each api module maps these to its wire form (WS error frame, JSON-RPC error) in one place.
"""

from __future__ import annotations

from coding_agent_env.errors import RequestError

__all__ = [
    "CapacityError",
    "SessionAttachedError",
    "SessionBusyError",
    "SessionClosedError",
    "SessionError",
    "UnknownSessionError",
]


class SessionError(RequestError):
    """A session could not be created, found or used as asked."""


class CapacityError(SessionError):
    """Every session slot is taken; nothing was created."""

    def __init__(self, active: int, maximum: int) -> None:
        super().__init__(
            f"Server at capacity: {active}/{maximum} sessions active. Cannot accept new connections."
        )
        self.active = active
        self.maximum = maximum


class UnknownSessionError(SessionError):
    """No live session has this id (never created, closed, or reaped when idle)."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"Unknown session_id: {session_id}")
        self.session_id = session_id


class SessionAttachedError(SessionError):
    """The session already has a WebSocket attached."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"Session {session_id} already has an attached WebSocket")
        self.session_id = session_id


class SessionBusyError(SessionError):
    """The session is already running a rollout; one at a time per session."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"Session {session_id} is already running a rollout")
        self.session_id = session_id


class SessionClosedError(SessionError):
    """The session was closed, or a close was asked for while its WebSocket is attached (it ends at detach):
    either way it runs no more rollouts."""

    def __init__(self, session_id: str, *, closing: bool) -> None:
        state = "is closing (a close was requested while its WebSocket is attached)" if closing else "is closed"
        super().__init__(f"Session {session_id} {state}; it runs no more rollouts")
        self.session_id = session_id
