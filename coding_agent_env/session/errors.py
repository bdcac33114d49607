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

from typing import ClassVar

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


class _AboutSession(SessionError):
    """An error about one session, `session_id`; `TEXT` is its message, `{session_id}` (and the details a
    subclass passes) filled in."""

    TEXT: ClassVar[str]

    def __init__(self, session_id: str, **details: str) -> None:
        super().__init__(self.TEXT.format(session_id=session_id, **details))
        self.session_id = session_id


class UnknownSessionError(_AboutSession):
    """No live session has this id (never created, closed, or reaped when idle)."""

    TEXT = "Unknown session_id: {session_id}"


class SessionAttachedError(_AboutSession):
    """The session already has a WebSocket attached."""

    TEXT = "Session {session_id} already has an attached WebSocket"


class SessionBusyError(_AboutSession):
    """The session is already running a rollout; one at a time per session."""

    TEXT = "Session {session_id} is already running a rollout"


class SessionClosedError(_AboutSession):
    """The session was closed, or a close was asked for while its WebSocket is attached (it ends at detach):
    either way it runs no more rollouts."""

    TEXT = "Session {session_id} {state}; it runs no more rollouts"

    def __init__(self, session_id: str, *, closing: bool) -> None:
        state = "is closing (a close was requested while its WebSocket is attached)" if closing else "is closed"
        super().__init__(session_id, state=state)
