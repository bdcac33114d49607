"""Interactive episodes: reset(task) -> terminal commands in a persistent shell -> final answer -> verify.

The trainer's own model is the agent: it sees the instruction, sends one command per `terminal` call, and
ends with a final answer, verified and scored exactly as a rollout is (`workspace.verify`).
"""

from coding_agent_env.episode.episode import Episode
from coding_agent_env.episode.errors import (
    EpisodeBusyError,
    EpisodeDoneError,
    EpisodeError,
    KeystrokesUnsupportedError,
    TaskArgumentsError,
    TerminalArgumentsError,
)
from coding_agent_env.episode.report import CommandRecord, EpisodeReport, EpisodeStatus, TerminalResult
from coding_agent_env.episode.task import is_task, parse_task
from coding_agent_env.episode.terminal import (
    KEYSTROKES_TOOL,
    TERMINAL_TOOL,
    KeystrokesCall,
    TerminalCall,
    parse_keystrokes,
    parse_terminal,
)

__all__ = [
    "KEYSTROKES_TOOL",
    "TERMINAL_TOOL",
    "KeystrokesCall",
    "CommandRecord",
    "Episode",
    "EpisodeBusyError",
    "EpisodeDoneError",
    "EpisodeError",
    "EpisodeReport",
    "EpisodeStatus",
    "KeystrokesUnsupportedError",
    "TaskArgumentsError",
    "TerminalArgumentsError",
    "TerminalCall",
    "TerminalResult",
    "is_task",
    "parse_keystrokes",
    "parse_task",
    "parse_terminal",
]
