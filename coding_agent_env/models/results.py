"""What comes back: each command's outcome, what verify did, and the result of a rollout.

`WorkspaceReport` holds what every run of the workspace lifecycle reports (the sandbox really used, its limits,
setup and verify, the reward): `RolloutResult` extends it, and so does the interactive episode's report
(`episode.report.EpisodeReport`), so the two results share these fields by construction.
"""

from __future__ import annotations

import math
from enum import Enum
from typing import Literal

from pydantic import Field, field_validator, model_validator

from coding_agent_env.models.turns import TrainingData, Turn
from coding_agent_env.models.common import Mode, WireModel

__all__ = [
    "AgentEvents",
    "AgentToolUse",
    "ArtifactReport",
    "CommandResult",
    "ErrorInfo",
    "GroupReport",
    "LIMIT_KINDS",
    "LimitScope",
    "PHASES",
    "RolloutResult",
    "RolloutStatus",
    "StepResult",
    "Timings",
    "VerifyContext",
    "WorkspaceReport",
    "limit_kind",
]


class RolloutStatus(str, Enum):
    """How a rollout ended. Only `completed`, `agent_failed` and `agent_timeout` carry a reward."""

    COMPLETED = "completed"
    AGENT_FAILED = "agent_failed"
    AGENT_TIMEOUT = "agent_timeout"
    SETUP_FAILED = "setup_failed"
    INFRA_ERROR = "infra_error"
    CANCELLED = "cancelled"


class CommandResult(WireModel):
    """A command that really ran: its exit code and output (each capped, UTF-8 with replacement)."""

    cmd: str
    exit_code: int = Field(
        description="Exit code; negative for a signal; 124 when it timed out (as timeout(1) reports it)."
    )
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class AgentToolUse(WireModel):
    name: str
    input: str = Field(default="", description="The tool's input, shortened.")


class AgentEvents(WireModel):
    """What the agent's own event stream said (CLI agents with JSON output), bounded and summarised."""

    events: int = 0
    steps: int = 0
    tool_calls: list[AgentToolUse] = Field(default_factory=list)
    texts: list[str] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)
    malformed: int = Field(default=0, description="Lines that were not parseable events.")
    tokens: int = 0


PHASES = ("provision", "setup", "agent", "verify", "collect", "teardown")
"""A rollout's phases, in order, as `Timings` names them (`<phase>_s`)."""

LIMIT_KINDS = ("memory", "disk", "pids", "cpu", "fsize", "other")
"""What a `limits_hit` entry is about (`limit_kind`)."""
_LIMIT_WORDS = (("memory", ("memory", "oom")), ("disk", ("disk",)), ("pids", ("process", "pids", "fork")),
                ("cpu", ("cpu",)), ("fsize", ("file size", "fsize")))


def limit_kind(text: str) -> str:
    """The kind of a `limits_hit` entry (`LIMIT_KINDS`), from the limit its text names (the backends' words)."""
    lowered = text.lower()
    for kind, words in _LIMIT_WORDS:
        if any(word in lowered for word in words):
            return kind
    return "other"


class Timings(WireModel):
    """Seconds spent in each phase (`PHASES`); a phase that did not run stays 0."""

    provision_s: float = 0.0
    setup_s: float = 0.0
    agent_s: float = 0.0
    verify_s: float = 0.0
    collect_s: float = 0.0
    teardown_s: float = 0.0
    total_s: float = 0.0
    llm_s: float = Field(default=0.0, description="Within `agent_s`: the time the agent waited on its LLM calls (the "
                         "union of the relayed calls' intervals); `agent_s - llm_s` is the environment's share.")


VerifyContext = Literal["workspace", "clean_room"]


class ArtifactReport(WireModel):
    """What a clean-room verify took from the agent's workspace."""

    copied: list[str] = Field(default_factory=list, description="Regular files copied into the clean room.")
    missing: list[str] = Field(default_factory=list, description="Declared artifacts that matched nothing.")
    refused: dict[str, str] = Field(
        default_factory=dict,
        description="Matching entries not copied, by path, with why (a symlink, a directory, a FIFO, over the cap).",
    )


class ErrorInfo(WireModel):
    """What went wrong, typed: `type` is an error class name, `stage` the pipeline stage."""

    # The one error shape of the workspace lifecycle (its docstring is the schema's description, so the note is
    # here): the two results carry it as their wire shapes have it, `RolloutResult` as `error` (`line()`,
    # upstream's one-line string) beside `error_detail` (this object), `EpisodeReport` as `error` (this object).

    type: str
    stage: str
    message: str

    def line(self) -> str:
        """The one-line form `RolloutResult.error` carries."""
        return f"{self.type} in {self.stage}: {self.message}"


LimitScope = Literal["process", "sandbox", "workdir", "watched"]


class GroupReport(WireModel):
    """How a member of a group (`Task.group_id`) got its set-up state."""

    group_id: str
    setup: Literal["forked", "per_member"] = Field(
        description="forked: the sandbox started from a copy-on-write fork of the group's set-up template (setup "
        "ran once, in the template; `setup_results` are its); per_member: the setup ran in this sandbox itself "
        "(`note` says why)."
    )
    template: str | None = Field(default=None, description="The template's id (forked members of one share it).")
    method: str | None = Field(default=None, description="How the template was frozen: overlay (local: an overlay "
                               "of its root), layers (Docker: its container's layer under each member's overlays) "
                               "or image (Docker: committed).")
    made_here: bool = Field(default=False, description="Whether this member's start made the template.")
    template_setup_s: float | None = Field(default=None, description="Seconds the template's setup took.")
    fork_s: float | None = Field(default=None, description="Seconds forking this member's sandbox took.")
    note: str | None = None


class WorkspaceReport(WireModel):
    """What one run of the workspace lifecycle reports: the sandbox, its limits, setup, verify and the reward."""

    sandbox: str
    isolation: str | None = Field(default=None, description="Isolation really in effect: bwrap, docker, none, ...")
    network: str | None = Field(
        default=None,
        description="Network really in effect: none, llm (only the LLM relay), llm-public (a remote sandbox's own "
        "network, the agent given the relay's public URL and its token) or host.",
    )
    limits: dict[str, int] = Field(
        default_factory=dict,
        description="Limits really enforced, by name: rlimits data, fsize, cpu, nproc; memory and disk (bytes), "
        "pids and nano_cpus (1e9 = one CPU) for the sandbox as a whole. A limit not listed was not enforced.",
    )
    limit_scopes: dict[str, LimitScope] = Field(
        default_factory=dict,
        description="Each limit's scope: per process (an rlimit), the whole sandbox, its workdir only, or watched "
        "(measured every second; the sandbox's commands are killed while it is passed).",
    )
    limits_hit: list[str] = Field(
        default_factory=list,
        description="Sandbox-wide limits the rollout ran into, in words (out of memory, process limit, disk quota "
        "exceeded); the commands they ended show it in their own results too.",
    )
    reward: float | None = Field(default=None, description="In [0,1]; null when the episode is invalid.")
    reward_note: str | None = Field(
        default=None, description="Why the reward is what it is when not obvious (e.g. a reward file was ignored)."
    )
    rewards: dict[str, float] | None = Field(
        default=None,
        description="Every named metric of the `reward.json` verify wrote (Harbor's multi-metric reward: a JSON "
        "object of metric name -> finite number), as written; null when the reward came from no reward.json (a "
        "reward.txt, the verify commands' exit codes) or is null. Where the task requires a reward file "
        "(`reward_file_required`), `reward.json` is read first, then `reward.txt`, and the scalar `reward` is the "
        "metric the task's `reward_metric` names (missing: 0, noted), else the `reward` metric if present, else "
        "the single metric if there is only one, else the mean of all the metrics; a metric it is taken from "
        "outside [0, 1] scores 0 (noted), as a reward.txt outside [0, 1] does. Other tasks keep the plain rule "
        "(a reward file stating one number in [0, 1], else the fraction of verify commands that passed) and carry "
        "`rewards` only when their reward came from a reward.json object.",
    )
    verify_context: VerifyContext | None = Field(
        default=None,
        description="Where verify ran: in the agent's own workspace, or in a clean room (a fresh sandbox with the "
        "task's files, the declared artifacts and the verify files only); null when verify did not run.",
    )
    artifacts: ArtifactReport | None = Field(
        default=None, description="What the clean room took from the agent's workspace (clean_room only)."
    )
    setup_results: list[CommandResult] = Field(default_factory=list)
    verify_results: list[CommandResult] = Field(default_factory=list)
    group: GroupReport | None = Field(
        default=None, description="A member of a group (`group_id`): how its set-up state was had; null otherwise."
    )

    @field_validator("reward")
    @classmethod
    def _reward_in_range(cls, reward: float | None) -> float | None:
        if reward is not None and not (math.isfinite(reward) and 0.0 <= reward <= 1.0):
            raise ValueError("reward must be a finite number in [0, 1]")
        return reward

    @field_validator("rewards")
    @classmethod
    def _rewards_finite(cls, rewards: dict[str, float] | None) -> dict[str, float] | None:
        if rewards is not None and not all(math.isfinite(value) for value in rewards.values()):
            raise ValueError("every metric of rewards must be a finite number")
        return rewards

    @model_validator(mode="after")
    def _no_metrics_without_reward(self) -> WorkspaceReport:
        """A result whose reward is null (an invalid episode, whatever verify wrote) carries no metrics either."""
        if self.reward is None and self.rewards is not None:
            self.rewards = None
        return self


class StepResult(WireModel):
    """One step that ran: its agent's exit, its setup and verify, its reward and named metrics."""

    name: str
    agent_exit_code: int | None = None
    agent_timed_out: bool = False
    setup_results: list[CommandResult] = Field(default_factory=list)
    verify_results: list[CommandResult] = Field(default_factory=list)
    reward: float | None = Field(default=None, description="The step's reward, by the task's reward rule.")
    rewards: dict[str, float] | None = Field(default=None, description="The step's named metrics (reward.json).")
    reward_note: str | None = None
    gate: str | None = Field(
        default=None, description="Why the task ended after this step (its `min_reward` not met); null if it did not."
    )


class RolloutResult(WorkspaceReport):
    """The outcome of one rollout. Never contains a secret."""

    rollout_id: str
    task_id: str = Field(default="", description="The request's task_id; empty when it gave none.")
    agent: str
    sandbox_id: str = Field(default="", description="The backend's id for the sandbox; empty if none was made.")
    mode: Mode = Field(default=Mode.BLACK_BOX, description="The request's mode.")
    status: RolloutStatus
    agent_exit_code: int | None = None
    files: dict[str, str] = Field(default_factory=dict, description="Workdir files after the agent: path -> text.")
    files_extra: list[str] = Field(
        default_factory=list, description="Workdir files not in `files` (binary, or over the size or count cap)."
    )
    proxy_turns: list[Turn] = Field(default_factory=list, description="Every LLM call the agent made, in order.")
    timings: Timings = Field(default_factory=Timings)
    wall_s: float = Field(default=0.0, description="The whole rollout, seconds (`timings.total_s`).")
    agent_log_tail: str = ""
    proxy_log_tail: str = Field(default="", description="The relay's log of this rollout's calls, one line each.")
    agent_events: AgentEvents | None = None
    steps: list[StepResult] = Field(
        default_factory=list,
        description="A multi-step task's steps that ran, in order (empty for a one-step task); `reward` and `rewards` "
        "are the task's `step_reward` of them.",
    )
    training: TrainingData | None = Field(
        default=None, description="Training trace and sequences of the calls the upstream returned token ids for."
    )
    error: str | None = Field(
        default=None, description="What went wrong, in one line (`error_detail` has it typed); null if nothing."
    )
    error_detail: ErrorInfo | None = None
