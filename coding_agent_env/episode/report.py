"""What an interactive episode reports: each command's outcome, and the episode as a whole (its `state`, and
what its reset and final answer return). Never contains a secret."""

from __future__ import annotations

from enum import Enum
from typing import Literal

from pydantic import Field

from coding_agent_env.models import ErrorInfo, WireModel, WorkspaceReport

__all__ = ["CallStats", "CommandRecord", "EpisodeReport", "EpisodeStatus", "TerminalResult"]


class EpisodeStatus(str, Enum):
    """Where an episode is. Only `completed` carries a reward."""

    RUNNING = "running"
    """Set up; taking `terminal` commands."""
    COMPLETED = "completed"
    """The final answer was verified and scored."""
    SETUP_FAILED = "setup_failed"
    INFRA_ERROR = "infra_error"
    EXPIRED = "expired"
    """Its total deadline or idle timeout passed."""
    CANCELLED = "cancelled"
    """Closed before its final answer: disconnect, session close, a new reset, shutdown."""


class TerminalResult(WireModel):
    """One `terminal` command's outcome: its output (stdout and stderr merged, bounded: the first and last
    halves of `EPISODE_MAX_OUTPUT_BYTES` with a note of how much was left out) and exit code."""

    output: str
    exit_code: int | None = Field(description="Null when the command timed out (its foreground job was ended), and "
                                              "for keystrokes.")
    timed_out: bool
    duration_s: float
    note: str | None = Field(default=None, description="What happened to the shell beyond the command's own output "
                             "(a timeout's interrupt, a shell that exited and was restarted).")


class CallStats(WireModel):
    """One episode tool's calls: how many, how many failed (refused, or the episode ended under them), and their
    total time."""

    count: int = 0
    failures: int = 0
    seconds: float = 0.0


class CommandRecord(WireModel):
    command: str = Field(description="The command, shortened.")
    exit_code: int | None
    timed_out: bool


class EpisodeReport(WorkspaceReport):
    """An episode as a whole. The sandbox, setup, verify and reward fields are `WorkspaceReport`'s, as in a
    rollout's result; `error` is the typed `ErrorInfo` itself (a rollout's result carries its one-line form in
    `error` and the object in `error_detail`, upstream's shape)."""

    episode_id: str
    task_id: str | None = None
    shell: Literal["live", "per_command"] | None = Field(
        default=None, description="`live`: one shell for the whole episode (background jobs and all shell state "
        "carry over, `keystrokes` works); `per_command`: one sandbox exec per command (the backend cannot hold a "
        "process: the working directory and exported variables carry over).")
    status: EpisodeStatus
    done: bool
    step_count: int = Field(description="terminal calls that ran (commands and the final answer).")
    sandbox_id: str | None = None
    commands: list[CommandRecord] = Field(default_factory=list, description="The latest commands run.")
    commands_dropped: int = Field(default=0, description="Earlier commands no longer listed.")
    calls: dict[str, CallStats] = Field(default_factory=dict, description="Calls by tool (`terminal`, "
                                        "`keystrokes`, `final_answer`): the environment's side of the time split.")
    error: ErrorInfo | None = None
