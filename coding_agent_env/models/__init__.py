"""Wire models shared by the server, the client and the gate.

`Task` is what is to be done; `RolloutRequest` (the `run_rollout` tool's argument set) is a task plus the agent
and endpoint that attempt it; `RolloutResult` is what every rollout returns. These models are the lowest layer of
the package: they import nothing from it but the wire limits in `settings` and the search-path rules in
`verify_env`.

    common    the base model (unknown fields refused), `Mode`, `NativeDialect` (named in `settings.dialects`)
    task      `Task`, `LimitsRequest`: the task's fields and their validation, once
    request   `RolloutRequest` (a `Task` with the agent and endpoint fields), the agent names, the schema
    turns     what the relay records of each LLM call, and the training data built from it
    results   command results, errors, `WorkspaceReport` (what both results share) and `RolloutResult`

Request validation here is structural (types, sizes, path shapes). Whether a named agent, backend or
endpoint is *available* is the server's business and is checked by the pipeline against `Settings`.
"""

from coding_agent_env.models.request import (
    AGENT_NAMES,
    AgentName,
    RolloutRequest,
    request_fields_schema,
    validation_summary,
)
from coding_agent_env.models.results import (
    AgentEvents,
    AgentToolUse,
    ArtifactReport,
    CommandResult,
    ErrorInfo,
    LimitScope,
    RolloutResult,
    RolloutStatus,
    StepResult,
    Timings,
    VerifyContext,
    GroupReport,
    WorkspaceReport,
)
from coding_agent_env.models.task import SANDBOX_OWN_ENV, LimitsRequest, Task, TaskStep, check_relative_path
from coding_agent_env.models.turns import (
    ToolCall,
    TrainingData,
    TrainingSequence,
    Turn,
    TurnMessage,
    TurnPurpose,
    Usage,
)
from coding_agent_env.models.common import Mode, NativeDialect, WireModel

__all__ = [
    "AGENT_NAMES",
    "SANDBOX_OWN_ENV",
    "AgentEvents",
    "AgentName",
    "AgentToolUse",
    "ArtifactReport",
    "CommandResult",
    "ErrorInfo",
    "LimitScope",
    "LimitsRequest",
    "Mode",
    "NativeDialect",
    "RolloutRequest",
    "RolloutResult",
    "RolloutStatus",
    "StepResult",
    "Task",
    "TaskStep",
    "Timings",
    "ToolCall",
    "TrainingData",
    "TrainingSequence",
    "Turn",
    "TurnMessage",
    "TurnPurpose",
    "Usage",
    "VerifyContext",
    "WireModel",
    "GroupReport",
    "WorkspaceReport",
    "check_relative_path",
    "request_fields_schema",
    "validation_summary",
]
