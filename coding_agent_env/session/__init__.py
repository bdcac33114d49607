"""Per-connection state: the manager (capacity, idle reaping, attach) and sessions (one rollout at a time)."""

from coding_agent_env.session.errors import (
    CapacityError,
    SessionAttachedError,
    SessionBusyError,
    SessionError,
    UnknownSessionError,
)
from coding_agent_env.session.manager import SessionManager
from coding_agent_env.session.session import Session, SessionKind

__all__ = [
    "CapacityError",
    "Session",
    "SessionAttachedError",
    "SessionBusyError",
    "SessionError",
    "SessionKind",
    "SessionManager",
    "UnknownSessionError",
]
