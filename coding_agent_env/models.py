"""Wire models shared by the server, the client and the gate.

`RolloutRequest` is the `run_rollout` tool's argument set; `RolloutResult` is what every rollout returns.
These models are the lowest layer of the package: they import nothing from it but the wire limits in `settings`
and the search-path rules in `verify_env`.

Request validation here is structural (types, sizes, path shapes). Whether a named agent, backend or
endpoint is *available* is the server's business and is checked by the pipeline against `Settings`.
"""

from __future__ import annotations

import math
import posixpath
import re
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from coding_agent_env.settings import WireLimits
from coding_agent_env.verify_env import AGENT_WRITABLE_ROOTS, workspace_entry

__all__ = [
    "AGENT_NAMES",
    "AgentEvents",
    "AgentToolUse",
    "ArtifactReport",
    "CommandResult",
    "ErrorInfo",
    "LimitsRequest",
    "Mode",
    "RolloutRequest",
    "RolloutResult",
    "RolloutStatus",
    "Timings",
    "ToolCall",
    "TrainingData",
    "TrainingSequence",
    "Turn",
    "TurnMessage",
    "TurnPurpose",
    "Usage",
    "VerifyContext",
    "validation_summary",
]

AGENT_NAMES: tuple[str, ...] = ("opencode", "pi", "terminus", "qwen-code", "mini-swe-agent", "claude-code", "codex", "gemini-cli", "oracle", "nop")
"""Agents a request may name. Which of them this server can run is decided by the agent registry."""


class RolloutStatus(str, Enum):
    """How a rollout ended. Only `completed`, `agent_failed` and `agent_timeout` carry a reward."""

    COMPLETED = "completed"
    AGENT_FAILED = "agent_failed"
    AGENT_TIMEOUT = "agent_timeout"
    SETUP_FAILED = "setup_failed"
    INFRA_ERROR = "infra_error"
    CANCELLED = "cancelled"


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SANDBOX_OWN_ENV = frozenset({"HOME", "TMPDIR", "USER", "LOGNAME", "REWARD_FILE"})
"""Variables that are the sandbox's (or verify's) own: neither a request's `env` nor an image's ENV sets them."""

NativeDialect = Literal["anthropic", "responses", "google"]
"""Agent wire dialects other than chat completions, by the names the relay gives them."""


class Mode(str, Enum):
    """How LLM calls are handled: `transparent_proxy` also asks the upstream for logprobs and token ids."""

    BLACK_BOX = "black_box"
    TRANSPARENT_PROXY = "transparent_proxy"


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _check_relative_path(path: str, what: str = "file path") -> str:
    """Normalise a workdir-relative path; refuse absolute paths, `..`, NUL and empty names."""
    if not path or "\x00" in path:
        raise ValueError(f"{what} must be a non-empty string without NUL bytes")
    if len(path.encode()) > WireLimits.MAX_PATH_BYTES:
        raise ValueError(f"{what} longer than {WireLimits.MAX_PATH_BYTES} bytes")
    if path.startswith("/") or path.startswith("\\"):
        raise ValueError(f"{what} {path!r} is absolute; paths are relative to the workdir")
    parts = path.replace("\\", "/").split("/")
    if ".." in parts:
        raise ValueError(f"{what} {path!r} contains '..'")
    normal = posixpath.normpath("/".join(parts))
    if normal in (".", ""):
        raise ValueError(f"{what} {path!r} names the workdir itself")
    return normal


class LimitsRequest(_Wire):
    """Sandbox limits a request asks for; each at most the server's (`SANDBOX_MEMORY_MB`, `SANDBOX_DISK_MB`,
    `SANDBOX_MAX_PROCESSES`, `SANDBOX_CPUS`), which also stand for what is not given."""

    memory_mb: int | None = Field(default=None, ge=16, description="Memory of the whole sandbox, MB.")
    disk_mb: int | None = Field(default=None, ge=1, description="Disk the sandbox may write, MB.")
    max_processes: int | None = Field(default=None, ge=8, description="Processes and threads of the whole sandbox.")
    cpus: float | None = Field(default=None, gt=0, le=1024, description="CPUs the sandbox may use at once.")


_UNSET_WHEN_EMPTY = frozenset(
    ("endpoint", "base_url", "api_key", "model", "task_id", "image", "template", "sandbox", "agent", "setup",
     "verify", "disable_thinking", "max_tokens_cap")
)
"""Request fields for which upstream clients send "" or null to mean "not given"."""


class RolloutRequest(_Wire):
    """One episode: a task (instruction, files, setup, verify), an agent, an endpoint and a sandbox."""

    instruction: str = Field(
        min_length=1,
        max_length=WireLimits.MAX_INSTRUCTION_CHARS,
        description="The task given to the agent, verbatim. It reaches the agent through a file, never argv.",
    )
    setup: list[str] = Field(
        default_factory=list,
        max_length=WireLimits.MAX_COMMANDS,
        description="Shell commands run in order in the workdir before the agent; the first failure stops "
        "the rollout with status setup_failed and reward null.",
    )
    verify: list[str] = Field(
        default_factory=list,
        max_length=WireLimits.MAX_COMMANDS,
        description="Shell commands run after the agent's process tree is dead. Reward: a number in [0,1] "
        "written to $REWARD_FILE, else the fraction of verify commands that exit 0.",
    )
    files: dict[str, str] = Field(
        default_factory=dict,
        description="Text files written into the workdir before setup: relative path -> content.",
    )
    verify_files: dict[str, str] = Field(
        default_factory=dict,
        description="Hidden test files: relative path -> content, written only for verify (never visible during "
        "setup or the agent's phase), replacing whatever the agent left at those paths.",
    )
    verify_files_root: Literal["workdir", "/tests"] = Field(
        default="workdir",
        description="Where `verify_files` are placed for verify: relative to the workdir, or under `/tests` (Harbor's "
        "layout; the directory is made afresh just before verify and removed with the sandbox). `/tests` needs a "
        "backend that can show it (local bubblewrap, Docker); elsewhere the rollout ends as an infra_error.",
    )
    reward_file_required: bool = Field(
        default=False,
        description="Whether verify must write the reward file (Harbor's rule): when it writes none, the reward is 0 "
        "and `reward_note` says so, instead of the fraction of verify commands that passed.",
    )
    artifacts: list[str] = Field(
        default_factory=list,
        max_length=WireLimits.MAX_ARTIFACT_PATTERNS,
        description="What the agent is expected to produce or change: workdir-relative paths or glob patterns "
        "(`*`, `?`, `[...]`; `*` also matches `/`). When given, verify runs in a clean room: a fresh sandbox "
        "with `files`, these artifacts (regular files only) and `verify_files`, and nothing else the agent wrote.",
    )
    solution: list[str] = Field(
        default_factory=list,
        max_length=WireLimits.MAX_COMMANDS,
        description="Reference solution commands, run by the 'oracle' agent in place of an LLM agent.",
    )
    agent: Literal["opencode", "pi", "terminus", "qwen-code", "mini-swe-agent", "claude-code", "codex", "gemini-cli", "oracle", "nop"] | None = Field(
        default=None,
        description="Agent to run: opencode, pi, terminus, qwen-code, mini-swe-agent, claude-code, codex, gemini-cli (LLM agents), oracle (runs `solution`) or nop; "
        "default: the server's (DEFAULT_AGENT, opencode unless set).",
    )
    endpoint: str | None = Field(
        default=None,
        max_length=WireLimits.MAX_NAME_CHARS,
        description="Name of an LLM endpoint in the server's catalog (openai, vllm, hf_router, ...); "
        "alternative to base_url + api_key + model.",
    )
    base_url: str | None = Field(
        default=None,
        max_length=WireLimits.MAX_URL_CHARS,
        description="OpenAI-compatible base URL. A caller-supplied base_url requires a caller-supplied api_key.",
    )
    api_key: SecretStr | None = Field(
        default=None,
        description="API key for base_url. Never enters the sandbox, the logs or the result.",
    )
    model: str | None = Field(default=None, max_length=WireLimits.MAX_NAME_CHARS, description="Model id, e.g. Qwen/Qwen3-4B.")
    mode: Mode = Field(
        default=Mode.BLACK_BOX,
        description="black_box records turns; transparent_proxy also asks the upstream for logprobs and token ids.",
    )
    sandbox: str | None = Field(
        default=None,
        max_length=WireLimits.MAX_NAME_CHARS,
        description="Sandbox backend, one of those the server enabled; default: the server's default backend.",
    )
    image: str | None = Field(
        default=None,
        max_length=WireLimits.MAX_NAME_CHARS,
        description="Container image or template for backends that use one; ignored by the local backend. "
        "`template` (OpenEnv's opencode_env name for it) is accepted as the same field.",
    )
    agent_timeout_s: float = Field(
        default=600.0,
        gt=0,
        le=WireLimits.MAX_AGENT_TIMEOUT_S,
        description="Deadline for the agent; at the deadline its whole process tree is killed (agent_timeout).",
    )
    command_timeout_s: float = Field(
        default=120.0,
        gt=0,
        le=WireLimits.MAX_COMMAND_TIMEOUT_S,
        description="Deadline for each setup and verify command.",
    )
    limits: LimitsRequest | None = Field(
        default=None, description="Sandbox limits, each within the server's own (which stand for what is not given)."
    )
    max_tokens_cap: int | None = Field(
        default=None,
        gt=0,
        description="Upper bound applied to max_tokens of every LLM call the agent makes; 0 or null: none.",
    )
    disable_thinking: bool | None = Field(
        default=None,
        description="Ask the upstream to disable reasoning output; null: the endpoint's default (on for vllm).",
    )
    top_logprobs: int = Field(
        default=0, ge=0, le=20, description="Logprobs per token to request in transparent_proxy mode."
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        max_length=WireLimits.MAX_ENV_VARS,
        description="Environment variables for every command in the sandbox (setup, the agent, verify), over the "
        "image's own ENV: PATH may be set; HOME, TMPDIR, USER, LOGNAME and REWARD_FILE are the sandbox's. "
        "A Harbor task's Dockerfile ENV arrives here on backends that do not build its image.",
    )
    verify_hardening: bool = Field(
        default=True,
        description="Verify runs hardened: Python with PYTHONSAFEPATH=1 and PYTHONNOUSERSITE=1 (neither the current "
        "nor the script's directory first on sys.path: `python3 -m unittest name` and `python3 -c 'import x'` no "
        "longer import from the workdir unless the command puts it on the path), PYTHONPATH, PYTHONHOME, "
        "PYTHONSTARTUP, LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, BASH_ENV and ENV emptied, and search-path entries "
        "(PATH, NODE_PATH, ...) inside places the agent can write dropped; `env` may then not point a search-path "
        "variable into them (refused). In a clean room, a reward file counts only with `reward_file_required` "
        "(the artifacts verify runs could write one). false: none of this.",
    )
    native_dialects: list[NativeDialect] = Field(
        default_factory=list,
        max_length=3,
        description="Agent dialects the upstream serves itself: a call in one goes upstream unchanged (model and "
        "max_tokens_cap applied) instead of translated to chat completions: anthropic at {base_url}/messages, "
        "responses at {base_url}/responses, google at {base_url}/models/MODEL:generateContent. Default: the "
        "endpoint's (LLM_ENDPOINTS native_dialects); none for a caller-supplied base_url.",
    )
    task_id: str | None = Field(
        default=None, max_length=WireLimits.MAX_NAME_CHARS, description="Caller's id for the task, echoed in the result."
    )

    @model_validator(mode="before")
    @classmethod
    def _upstream_arguments(cls, data: Any) -> Any:
        """OpenEnv's `OpenCodeEnv` / `PiEnv` clients send every argument: "" and null mean "not given"."""
        if not isinstance(data, dict):
            return data
        data = {key: value for key, value in data.items() if not (key in _UNSET_WHEN_EMPTY and value in ("", None))}
        if "template" in data:
            template = data.pop("template")
            if "image" in data and data["image"] != template:
                raise ValueError("give image or template (the same field), not both")
            data["image"] = template
        if data.get("max_tokens_cap") == 0:
            del data["max_tokens_cap"]
        return data

    @field_validator("files", "verify_files")
    @classmethod
    def _files_confined(cls, files: dict[str, str]) -> dict[str, str]:
        if len(files) > WireLimits.MAX_FILES:
            raise ValueError(f"at most {WireLimits.MAX_FILES} files")
        total = 0
        out: dict[str, str] = {}
        for path, text in files.items():
            normal = _check_relative_path(path)
            if normal in out:
                raise ValueError(f"file path {path!r} given twice")
            total += len(text.encode("utf-8", "surrogatepass"))
            out[normal] = text
        if total > WireLimits.MAX_FILES_BYTES:
            raise ValueError(f"files total more than {WireLimits.MAX_FILES_BYTES} bytes")
        return out

    @field_validator("artifacts")
    @classmethod
    def _artifacts_confined(cls, patterns: list[str]) -> list[str]:
        return [_check_relative_path(pattern, "artifact") for pattern in patterns]

    @field_validator("setup", "verify", "solution")
    @classmethod
    def _commands_bounded(cls, commands: list[str]) -> list[str]:
        for cmd in commands:
            if not cmd.strip():
                raise ValueError("commands must not be empty")
            if len(cmd.encode("utf-8", "surrogateescape")) > WireLimits.MAX_COMMAND_BYTES:
                raise ValueError(f"command longer than {WireLimits.MAX_COMMAND_BYTES} bytes (UTF-8)")
            if "\x00" in cmd:
                raise ValueError("commands must not contain NUL bytes")
        return commands

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        total = 0
        for name, value in env.items():
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(f"env name {name[:64]!r} is not a variable name ([A-Za-z_][A-Za-z0-9_]*)")
            if name in SANDBOX_OWN_ENV:
                raise ValueError(f"env may not set {name}: it is the sandbox's own")
            if "\x00" in value:
                raise ValueError(f"env {name} contains a NUL byte")
            total += len(name) + len(value.encode("utf-8", "surrogateescape"))
        if total > WireLimits.MAX_ENV_BYTES:
            raise ValueError(f"env totals more than {WireLimits.MAX_ENV_BYTES} bytes")
        return env

    @field_validator("instruction")
    @classmethod
    def _instruction_not_blank(cls, instruction: str) -> str:
        if not instruction.strip():
            raise ValueError("instruction must not be blank")
        return instruction

    @model_validator(mode="after")
    def _files_total_bounded(self) -> RolloutRequest:
        total = sum(len(text.encode("utf-8", "surrogatepass")) for text in self.files.values())
        total += sum(len(text.encode("utf-8", "surrogatepass")) for text in self.verify_files.values())
        if total > WireLimits.MAX_FILES_BYTES:
            raise ValueError(f"files and verify_files total more than {WireLimits.MAX_FILES_BYTES} bytes")
        return self

    @model_validator(mode="after")
    def _env_outside_the_workspace(self) -> RolloutRequest:
        """Hardened verify runs with the task's `env`: a search path into what the agent can write would hand
        verify to the agent (a planted `python3` on PATH, a library in LD_PRELOAD)."""
        if not self.verify_hardening:
            return self
        for name, value in self.env.items():
            problem = workspace_entry(name, value)
            if problem is not None:
                raise ValueError(
                    f"env {problem}: verify would load what the agent left there. Point it outside "
                    f"{', '.join(AGENT_WRITABLE_ROOTS)}, or set verify_hardening: false"
                )
        return self

    @model_validator(mode="after")
    def _endpoint_consistent(self) -> RolloutRequest:
        if self.base_url is not None and self.api_key is None:
            raise ValueError("a caller-supplied base_url requires a caller-supplied api_key")
        return self


class CommandResult(_Wire):
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


class ToolCall(_Wire):
    id: str | None = None
    name: str | None = None
    arguments: str = ""


class TurnMessage(_Wire):
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)


class Usage(_Wire):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None


TurnPurpose = Literal["main", "retry", "subagent", "auxiliary", "compaction"]


class Turn(_Wire):
    """One LLM call the agent made, as the relay saw it.

    The prompt is recorded incrementally so the trace grows linearly with the conversation: this call's
    request messages are the previous turn's request messages cut to `request_messages_reused`, followed by
    `request_messages`. The fields OpenEnv's `opencode_env` / `pi_env` put in a `RolloutTurn` (`turn`,
    `finish_reason`, `completion_tokens`, `completion_token_ids`, `per_token_logps`, `latency_s`, `timestamp`,
    `upstream_status`, `upstream_error`) have its names and types.
    """

    turn: int = Field(description="Position of the call in the rollout, from 0.")
    stream: bool | None = None
    request_messages_reused: int = 0
    request_messages: list[dict[str, Any]] = Field(default_factory=list)
    request_tools: list[dict[str, Any]] | None = Field(
        default=None, description="The call's tools, when not the previous call's (`request_tools_reused`)."
    )
    request_tools_reused: bool = False
    model: str | None = None
    message: TurnMessage = Field(default_factory=TurnMessage)
    finish_reason: str | None = None
    usage: Usage | None = None
    latency_s: float = 0.0
    timestamp: float = Field(default=0.0, description="When the call reached the relay, Unix seconds.")
    upstream_status: int | None = None
    upstream_error: dict[str, Any] | None = Field(
        default=None, description="Why the call failed: the upstream's error object, or the relay's (`message`)."
    )
    error: str | None = None
    passthrough: NativeDialect | None = Field(
        default=None,
        description="The dialect the call went upstream in unchanged (the upstream speaks it natively); null: sent "
        "as chat completions. The message, tool calls, finish reason and usage are read back from that dialect.",
    )
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] = Field(
        default_factory=list, description="The sampled token ids, when the upstream returned them."
    )
    completion_tokens: list[str] = Field(
        default_factory=list, description="The sampled tokens as the upstream spelled them in its logprobs."
    )
    per_token_logps: list[float] = Field(
        default_factory=list, description="Log-probability of each sampled token, when the upstream returned them."
    )
    node_id: str = Field(default="", description="The call's id in the rollout graph and the training trace.")
    parent: int | None = Field(
        default=None,
        description="The call this one continues: its prompt and completion are a prefix of this call's prompt "
        "(by token ids; by messages when the upstream returned none). Null for a root.",
    )
    purpose: TurnPurpose | None = Field(
        default=None,
        description="main (the agent's main line), retry (a sibling that never continued), subagent (a root of "
        "its own with tools), auxiliary (a call without the agent's tools: a title, a summary), compaction (the "
        "agent's conversation restarted from a rewritten history).",
    )
    trainable: bool = Field(default=False, description="Whether its sampled tokens are in the loss (loss_mask 1).")
    note: str | None = Field(default=None, description="Why the call is not trainable, when it is not.")


class TrainingSequence(_Wire):
    """One root-to-leaf path of the rollout graph as one token sequence, ready for a trainer."""

    node_ids: list[str]
    purpose: TurnPurpose = Field(description="The purpose of the path's last call.")
    input_ids: list[int] = Field(description="The last call's prompt ids followed by its sampled ids.")
    loss_mask: list[int] = Field(description="1 on the sampled tokens of trainable calls along the path, else 0.")
    logprobs: list[float] = Field(description="The sampler's logprob at each sampled position, 0.0 elsewhere.")


class TrainingData(_Wire):
    """What a trainer needs from a rollout (see `llm.trace`)."""

    trace: dict[str, Any] = Field(
        description="A training trace (`schema_version`, `turns`) that OpenEnv 0.10's "
        "`openenv.core.harness.training.TrainingTrace.model_validate` accepts unchanged: each call with prompt "
        "token ids, with `node_id`, its ids and logprobs and a `loss_mask` over prompt plus completion."
    )
    sequences: list[TrainingSequence] = Field(default_factory=list)
    reward: float | None = Field(default=None, description="The rollout's reward; null when unscored, never 0.")


class AgentToolUse(_Wire):
    name: str
    input: str = Field(default="", description="The tool's input, shortened.")


class AgentEvents(_Wire):
    """What the agent's own event stream said (CLI agents with JSON output), bounded and summarised."""

    events: int = 0
    steps: int = 0
    tool_calls: list[AgentToolUse] = Field(default_factory=list)
    texts: list[str] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)
    malformed: int = Field(default=0, description="Lines that were not parseable events.")
    tokens: int = 0


class Timings(_Wire):
    """Seconds spent in each phase; a phase that did not run stays 0."""

    provision_s: float = 0.0
    setup_s: float = 0.0
    agent_s: float = 0.0
    verify_s: float = 0.0
    collect_s: float = 0.0
    teardown_s: float = 0.0
    total_s: float = 0.0


VerifyContext = Literal["workspace", "clean_room"]


class ArtifactReport(_Wire):
    """What a clean-room verify took from the agent's workspace."""

    copied: list[str] = Field(default_factory=list, description="Regular files copied into the clean room.")
    missing: list[str] = Field(default_factory=list, description="Declared artifacts that matched nothing.")
    refused: dict[str, str] = Field(
        default_factory=dict,
        description="Matching entries not copied, by path, with why (a symlink, a directory, a FIFO, over the cap).",
    )


class ErrorInfo(_Wire):
    """What went wrong, typed: `type` is an error class name, `stage` the pipeline stage."""

    type: str
    stage: str
    message: str

    def line(self) -> str:
        """The one-line form `RolloutResult.error` carries."""
        return f"{self.type} in {self.stage}: {self.message}"


class RolloutResult(_Wire):
    """The outcome of one rollout. Never contains a secret."""

    rollout_id: str
    task_id: str = Field(default="", description="The request's task_id; empty when it gave none.")
    agent: str
    sandbox: str
    sandbox_id: str = Field(default="", description="The backend's id for the sandbox; empty if none was made.")
    mode: Mode = Field(default=Mode.BLACK_BOX, description="The request's mode.")
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
    limit_scopes: dict[str, Literal["process", "sandbox", "workdir", "watched"]] = Field(
        default_factory=dict,
        description="Each limit's scope: per process (an rlimit), the whole sandbox, its workdir only, or watched "
        "(measured every second; the sandbox's commands are killed while it is passed).",
    )
    limits_hit: list[str] = Field(
        default_factory=list,
        description="Sandbox-wide limits the rollout ran into, in words (out of memory, process limit, disk quota "
        "exceeded); the commands they ended show it in their own results too.",
    )
    status: RolloutStatus
    reward: float | None = Field(default=None, description="In [0,1]; null when the episode is invalid.")
    reward_note: str | None = Field(
        default=None, description="Why the reward is what it is when not obvious (e.g. a reward file was ignored)."
    )
    verify_context: VerifyContext | None = Field(
        default=None,
        description="Where verify ran: in the agent's own workspace, or in a clean room (a fresh sandbox with the "
        "task's files, the declared artifacts and the verify files only); null when verify did not run.",
    )
    artifacts: ArtifactReport | None = Field(
        default=None, description="What the clean room took from the agent's workspace (clean_room only)."
    )
    agent_exit_code: int | None = None
    setup_results: list[CommandResult] = Field(default_factory=list)
    verify_results: list[CommandResult] = Field(default_factory=list)
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
    training: TrainingData | None = Field(
        default=None, description="Training trace and sequences of the calls the upstream returned token ids for."
    )
    error: str | None = Field(
        default=None, description="What went wrong, in one line (`error_detail` has it typed); null if nothing."
    )
    error_detail: ErrorInfo | None = None

    @field_validator("reward")
    @classmethod
    def _reward_in_range(cls, reward: float | None) -> float | None:
        if reward is not None and not (math.isfinite(reward) and 0.0 <= reward <= 1.0):
            raise ValueError("reward must be a finite number in [0, 1]")
        return reward


def request_fields_schema() -> dict[str, Any]:
    """JSON schema of the request's fields (the `run_rollout` tool's input schema)."""
    return RolloutRequest.model_json_schema()


def validation_summary(exc: ValidationError) -> str:
    """One line naming each bad field and why, without echoing the values (they may hold secrets)."""
    parts = [f"{'.'.join(str(p) for p in err['loc']) or 'arguments'}: {err['msg']}" for err in exc.errors()[:5]]
    more = f" (and {exc.error_count() - 5} more)" if exc.error_count() > 5 else ""
    return "; ".join(parts) + more
