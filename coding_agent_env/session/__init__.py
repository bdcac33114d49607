"""Per-connection state: the manager (capacity, idle reaping, attach) and sessions (one rollout at a time)."""

from coding_agent_env.session.errors import (
    CapacityError,
    SessionAttachedError,
    SessionBusyError,
    SessionClosedError,
    SessionError,
    UnknownSessionError,
)
from coding_agent_env.session.manager import SessionManager
from coding_agent_env.session.session import NoEpisodeError, Session, SessionKind, SessionState

__all__ = [
    "CapacityError",
    "NoEpisodeError",
    "Session",
    "SessionAttachedError",
    "SessionBusyError",
    "SessionClosedError",
    "SessionError",
    "SessionKind",
    "SessionManager",
    "SessionState",
    "UnknownSessionError",
]
