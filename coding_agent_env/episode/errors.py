"""Errors of the episode boundary: what a caller of an interactive episode did wrong.

    RequestError (coding_agent_env.errors)
    └── EpisodeError
        ├── TaskArgumentsError      `reset`'s task arguments do not describe a task
        ├── TerminalArgumentsError  a `terminal` call's arguments are not one command or one final answer
        ├── EpisodeBusyError        a call of the episode is still running (one at a time)
        └── EpisodeDoneError        the episode has ended: it runs nothing more

Each is a precise error of that one call: the episode (unless it had ended) and the session stay usable.
Messages never echo argument values (they may hold secrets) and never carry a traceback.
"""

from __future__ import annotations

from coding_agent_env.errors import RequestError

__all__ = [
    "EpisodeBusyError", "EpisodeDoneError", "EpisodeError", "KeystrokesUnsupportedError", "TaskArgumentsError",
    "TerminalArgumentsError",
]


class EpisodeError(RequestError):
    """An interactive episode could not be started or used as asked."""


class TaskArgumentsError(EpisodeError):
    """`reset`'s task arguments are not a valid task; nothing was started."""


class TerminalArgumentsError(EpisodeError):
    """A `terminal` call's arguments are not exactly one command or one final answer; nothing ran."""


class EpisodeBusyError(EpisodeError):
    """A call of this episode is still running; calls run one at a time."""

    def __init__(self, episode_id: str) -> None:
        super().__init__(f"episode {episode_id} is still running a call; one at a time")


class EpisodeDoneError(EpisodeError):
    """The episode has ended (final answer, setup failure, deadline, idle timeout, close): start a new one
    with `reset`."""

    def __init__(self, episode_id: str, status: str, reason: str | None = None) -> None:
        why = f": {reason}" if reason else ""
        super().__init__(f"episode {episode_id} has ended ({status}{why}); start a new one with reset")
        self.status = status


class KeystrokesUnsupportedError(EpisodeError):
    """`keystrokes` in an episode whose shell is one exec per command (its backend cannot hold a process)."""

    def __init__(self, backend: str) -> None:
        super().__init__(f"keystrokes need a live shell, and sandbox backend {backend!r} runs one exec per command: "
                         "use terminal")
