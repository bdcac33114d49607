"""What an interactive episode reports: each command's outcome, and the episode as a whole (its `state`, and
what its reset and final answer return). Never contains a secret."""

from __future__ import annotations

from enum import Enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from coding_agent_env.models import ArtifactReport, CommandResult, ErrorInfo, VerifyContext

__all__ = ["CommandRecord", "EpisodeReport", "EpisodeStatus", "TerminalResult"]


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


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TerminalResult(_Wire):
    """One `terminal` command's outcome: its output (stdout and stderr merged, bounded: the first and last
    halves of `EPISODE_MAX_OUTPUT_BYTES` with a note of how much was left out) and exit code."""

    output: str
    exit_code: int | None = Field(description="Null when the command timed out (its whole tree was killed).")
    timed_out: bool
    duration_s: float


class CommandRecord(_Wire):
    command: str = Field(description="The command, shortened.")
    exit_code: int | None
    timed_out: bool


class EpisodeReport(_Wire):
    episode_id: str
    task_id: str | None = None
    status: EpisodeStatus
    done: bool
    step_count: int = Field(description="terminal calls that ran (commands and the final answer).")
    sandbox: str
    sandbox_id: str | None = None
    isolation: str | None = None
    network: str | None = None
    limits: dict[str, int] = Field(default_factory=dict)
    limit_scopes: dict[str, Literal["process", "sandbox", "workdir", "watched"]] = Field(default_factory=dict)
    limits_hit: list[str] = Field(default_factory=list)
    reward: float | None = Field(default=None, description="In [0,1] once completed; null otherwise.")
    reward_note: str | None = None
    setup_results: list[CommandResult] = Field(default_factory=list)
    verify_results: list[CommandResult] = Field(default_factory=list)
    verify_context: VerifyContext | None = None
    artifacts: ArtifactReport | None = None
    commands: list[CommandRecord] = Field(default_factory=list, description="The latest commands run.")
    commands_dropped: int = Field(default=0, description="Earlier commands no longer listed.")
    error: ErrorInfo | None = None
