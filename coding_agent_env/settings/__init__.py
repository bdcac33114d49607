"""Every default and limit of the server, defined once.

`WireLimits` bounds what a request may carry (the request models enforce them at parse time).
`Settings` is the operator's configuration; `Settings.from_env()` is the only place that reads the
environment: each field is read from the upper-cased variable of the same name (`MAX_CONCURRENT_ENVS`,
`STATE_DIR`, ...), and the sandbox backends from `SANDBOX_BACKENDS=local,docker` and each backend's own
variables (`DOCKER_HOST`, ...: see `backend_config`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from coding_agent_env.settings import secrets
from coding_agent_env.settings.dialects import NativeDialect
from coding_agent_env.settings.backends import (
    BACKEND_KINDS,
    BackendConfig,
    DockerConfig,
    E2bConfig,
    HfConfig,
    LauncherTimeouts,
    LocalConfig,
)
from coding_agent_env.errors import SettingsError, UnknownBackendError

__all__ = [
    "BackendConfig",
    "DockerConfig",
    "E2bConfig",
    "HfConfig",
    "LauncherTimeouts",
    "LlmEndpoint",
    "LocalConfig",
    "Settings",
    "SettingsSection",
    "WireLimits",
]

_MIB = 1024 * 1024
_Section = TypeVar("_Section", bound="SettingsSection")


class WireLimits:
    """Hard caps on request contents, enforced by the request models."""

    MAX_INSTRUCTION_CHARS: ClassVar[int] = 4 * _MIB
    MAX_COMMANDS: ClassVar[int] = 256
    MAX_COMMAND_BYTES: ClassVar[int] = 128 * 1024 - 1
    """A setup, solution or verify command, in UTF-8: it runs as one `bash -c` argument, and the kernel caps one
    argument at 128 KiB with its NUL (a longer one could only fail at exec, as an infrastructure error)."""
    MAX_FILES: ClassVar[int] = 1000
    MAX_FILES_BYTES: ClassVar[int] = 16 * _MIB
    """Total of `files` and `verify_files`."""
    MAX_ARTIFACT_PATTERNS: ClassVar[int] = 256
    MAX_ENV_VARS: ClassVar[int] = 128
    MAX_ENV_BYTES: ClassVar[int] = 64 * 1024
    """Total of `env`'s names and values."""
    MAX_PATH_BYTES: ClassVar[int] = 1024
    MAX_NAME_CHARS: ClassVar[int] = 512
    MAX_URL_CHARS: ClassVar[int] = 2048
    MAX_AGENT_TIMEOUT_S: ClassVar[float] = 4 * 3600.0
    MAX_COMMAND_TIMEOUT_S: ClassVar[float] = 3600.0
    MAX_FINAL_ANSWER_BYTES: ClassVar[int] = 1 * _MIB
    """An interactive episode's final answer, in UTF-8."""


class LlmEndpoint(BaseModel):
    """One entry of the LLM endpoint catalog: an OpenAI-compatible base URL and what it supports.

    A server-held `api_key` is only ever sent to this entry's `base_url`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_url: str
    """OpenAI-compatible base URL, e.g. `https://api.openai.com/v1`."""

    api_key: SecretStr | None = None
    """Server-held key for `base_url`; callers may bring their own instead."""

    default_model: str | None = None
    """Model used when the request names none."""

    needs_key: bool = True
    """Whether a call without any key (server-held or caller's) is refused before it starts."""

    token_ids: bool = False
    """The upstream understands vLLM's `return_token_ids` (asked for in transparent_proxy mode)."""

    disable_thinking_default: bool = False
    """Whether thinking is off for a request that does not say (`disable_thinking` null)."""

    disable_thinking_body: dict[str, Any] = Field(
        default_factory=lambda: {"chat_template_kwargs": {"enable_thinking": False}}
    )
    """Merged into the request body when a rollout asks for `disable_thinking`."""

    engine: Literal["vllm", "sglang", "llamacpp", "openai"] | None = None
    """The inference engine serving `base_url` (how token ids and logprobs are asked for and read back, see
    `coding_agent_env.llm.engines`); null: detected from its first answers and cached per base URL."""

    native_dialects: tuple[NativeDialect, ...] = ()
    """Agent dialects `base_url` serves itself (anthropic: `{base_url}/messages`, responses: `{base_url}/responses`,
    google: `{base_url}/models/M:generateContent`): calls in them are passed through, not translated."""


PUBLIC_RELAY_PATH = "/llm/v1"
"""Where the server serves the relay on its own port, for remote sandboxes (per-rollout bearer tokens only)."""


def _default_agents_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/opt/coding-agent-env/agents")
    return Path.home() / ".cache" / "coding-agent-env" / "agents"


def _default_state_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"coding-agent-env-{os.getuid()}"


class Settings(BaseModel):
    """Operator configuration. Immutable; build one with `Settings.from_env()` or keyword arguments."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backends: tuple[BackendConfig, ...] = (LocalConfig(),)
    """The sandbox backends a request may pick, each with its configuration; the first is the default.
    From the environment: `SANDBOX_BACKENDS=local,docker` (names, default `local`), each configured from its
    own variables (see `backend_config`)."""

    state_dir: Path = Field(default_factory=_default_state_dir)
    """Where the local backend keeps per-sandbox roots; orphans here are reaped at startup."""

    sandbox_workdir: str = "/workspace"
    """The workdir path as commands inside an isolated sandbox see it."""

    sandbox_memory_mb: int = Field(default=4096, ge=16)
    """Memory of a whole sandbox (its cgroup as root, a container's limit), and each process's data segment
    (RLIMIT_DATA). The most a request may ask for (`RolloutRequest.limits`)."""

    sandbox_disk_mb: int = Field(default=4096, ge=1)
    """Disk a sandbox may write (a tmpfs of this size as root; a watched budget otherwise; Docker: its
    workdir). The most a request may ask for."""

    sandbox_max_processes: int = Field(default=512, ge=8)
    """Processes and threads of a whole sandbox (its cgroup's pids limit; RLIMIT_NPROC where it counts only
    the sandbox's own). The most a request may ask for."""

    sandbox_cpus: float = Field(default=2.0, ge=0)
    """CPUs a sandbox may use at once (a CFS quota; 0: not bounded). The most a request may ask for."""

    sandbox_max_file_mb: int = 1024
    """Largest file a sandboxed process may write (RLIMIT_FSIZE)."""

    sandbox_cpu_s: int = 4 * 3600
    """CPU seconds per sandboxed process (RLIMIT_CPU)."""

    agents_dir: Path = Field(default_factory=_default_agents_dir)
    """Host prefix where `coding-agent-env agents install` puts the pinned CLI agents; sandboxes see it
    read-only (at `Sandbox.agents_dir`). Nothing is installed per rollout."""

    terminus_max_turns: int = Field(default=50, ge=1)
    """LLM calls the built-in Terminus agent makes before it gives up (exit code 3)."""

    terminus_command_timeout_s: float = Field(default=120.0, gt=0)
    """Deadline of each Terminus command; its whole process tree is killed at it."""

    terminus_max_output_bytes: int = Field(default=16 * 1024, ge=256)
    """Bytes of a command's output Terminus shows the model: its first and last halves, and how much was left
    out between."""

    terminus_llm_timeout_s: float = Field(default=600.0, gt=0)
    """Deadline of one Terminus LLM call."""

    terminus_loose_parsing: bool = False
    """Let Terminus treat fenced shell blocks and bare prose as commands when a reply has no tool call."""

    provision_timeout_s: float = 60.0
    """Deadline for creating a sandbox and writing the request's files."""

    collect_timeout_s: float = 30.0
    """Deadline for reading files back out of the sandbox."""

    teardown_timeout_s: float = 30.0
    """Deadline for closing a sandbox."""

    group_idle_s: float = Field(default=30.0, gt=0)
    """How long a group's set-up template is kept once no member holds it (env GROUP_IDLE_S): members of a
    group that run a few at a time still start from the same one; past it, the next member sets it up anew."""

    group_max_templates: int = Field(default=8, ge=0)
    """Group set-up templates this server holds at once, being made, in use or idle (env GROUP_MAX_TEMPLATES;
    each local one holds a host uid and a RAM-backed tmpfs: keep it well below SANDBOX_UID_COUNT, which the
    sessions' sandboxes draw from too). Past it the least recently used idle one is evicted; when none is idle a
    new group's members set up on their own (`group.setup` `per_member`). 0: never fork."""

    group_max_templates_per_caller: int = Field(default=4, ge=0)
    """Group templates one caller (a session: WebSocket, JSON-RPC, MCP, UI) may have started and still hold
    (env GROUP_MAX_TEMPLATES_PER_CALLER): past it, its own least recently used idle one is evicted, or its new
    group sets up per member, so one client cannot take every template."""

    group_template_budget_mb: int = Field(default=2048, ge=0)
    """Bytes the group templates' writable layers may hold together, server-wide (env
    GROUP_TEMPLATE_BUDGET_MB; local: their tmpfs, in RAM; Docker: their container layers). A new template is
    started only under it (idle ones evicted first, least recently used first); one made over it is released
    as soon as its last member leaves."""

    max_output_bytes: int = 64 * 1024
    """Bytes of stdout and of stderr kept per command (the rest is drained and dropped)."""

    agent_log_tail_bytes: int = 16 * 1024
    """Bytes of the agent's log kept in the result."""

    collect_max_files: int = 200
    collect_max_file_bytes: int = 256 * 1024
    collect_max_total_bytes: int = 2 * _MIB
    collect_max_omitted: int = 1000
    """Caps on files read back from the workdir; files beyond them are listed in `files_extra`."""

    artifact_max_files: int = Field(default=1000, ge=1)
    artifact_max_file_bytes: int = Field(default=16 * _MIB, ge=1)
    artifact_max_total_bytes: int = Field(default=64 * _MIB, ge=1)
    artifact_max_listing: int = Field(default=100_000, ge=1)
    """Caps on the declared artifacts a clean room takes from the agent's workspace (regular files; what is over
    a cap is refused and reported), and on the workspace entries listed to match their patterns."""

    episode_timeout_s: float = Field(default=3600.0, gt=0)
    """Total deadline of an interactive episode, from `reset` (provision and setup included) to its final
    answer's verify; at it the episode ends (`expired`) and its sandbox is torn down."""

    episode_idle_timeout_s: float = Field(default=600.0, gt=0)
    """An interactive episode with no call for this long ends (`expired`) and its sandbox is torn down."""

    episode_max_output_bytes: int = Field(default=16 * 1024, ge=256)
    """Bytes of a `terminal` command's output an episode returns: its first and last halves, and how much was
    left out between."""

    episode_max_history: int = Field(default=100, ge=0)
    """Commands an episode's `state` lists (the latest; each shortened)."""

    max_concurrent_envs: int = 8
    """Sessions (WebSocket, JSON-RPC, MCP, UI) alive at once."""

    session_idle_timeout_s: float = Field(default=300.0, gt=0)
    """HTTP-created (JSON-RPC), MCP and UI sessions with no activity for this long are closed and their slot freed
    (a UI session is busy while its rollout runs; one holding an episode whose browser went away is closed)."""

    session_reap_interval_s: float = Field(default=5.0, gt=0)
    """How often the idle reaper looks for idle sessions."""

    host: str = "127.0.0.1"
    """Interface the server binds; all interfaces (0.0.0.0) is an explicit choice."""

    port: int = Field(default=8000, ge=1, le=65535)
    """TCP port the server listens on."""

    results_db: Path | SecretStr | None = None
    """The results store that `coding-agent-env run` and, with `RESULTS_FROM_SERVER`, the server write every
    finished rollout to, and the web tab's Runs view reads: a SQLite file's path, or a PostgreSQL URL
    (`postgresql://` or `postgres://`, libpq's form; kept secret: it may carry a password) that several server
    replicas share; None: `STATE_DIR/results.sqlite`. Any other `scheme:` is refused, never taken as a path."""

    @field_validator("results_db", mode="before")
    @classmethod
    def _parse_results_db(cls, value: Any) -> Any:
        from coding_agent_env.runs.store_location import PostgresLocation, parse_location  # the rules live there

        if value is None or isinstance(value, (Path, SecretStr)):
            return value
        if isinstance(value, str) and not value.strip():
            return None
        location = parse_location(value)
        return SecretStr(location.url) if isinstance(location, PostgresLocation) else location

    results_from_server: bool = False
    """Whether the server keeps every rollout it runs in the results store (batches always do)."""

    image_builds: bool = False
    """Whether clients may have this server build a task's Docker image from a build context they send (`POST
    /images`: what `coding-agent-env run --server` does for a Harbor task on Docker). Off unless the operator says:
    a build runs the Dockerfile's steps on the Docker engine."""

    image_build_max_mb: int = Field(default=256, ge=1, le=4096)
    """The largest build context `POST /images` takes, sent and unpacked."""

    image_map: dict[str, str] = Field(default_factory=dict)
    """Base images rewritten before a task's image is built (each `FROM`) and prebuilt task images mapped, for
    private registries, mirrors and offline hosts: env IMAGE_MAP, comma-separated `FROM=TO` (an exact reference,
    or a registry / repository prefix; the rules: `tasks.images`). `run --image-map FROM=TO` adds to it."""

    @field_validator("image_map", mode="before")
    @classmethod
    def _parse_image_map(cls, value: Any) -> Any:
        from coding_agent_env.tasks.images import parse_image_map  # the rules live with the tasks

        return parse_image_map(value)

    tasks: tuple[str, ...] = ()
    """The server's task set (`tasks.catalog`): sources `PATH` or `SPLIT=PATH` (Harbor task directories, a directory
    of split directories, JSONL or request files), served through OpenEnv's Task API and runnable by
    `reset(split=, index=)`; env TASKS, comma-separated; `serve --tasks` sets it."""

    task_sampler: Literal["uniform", "sequential", "curriculum"] = "uniform"
    """What picks a task of the set when a reset names a split but no index or seed (`tasks.sampler`):
    `curriculum` favours tasks whose GRPO groups still carry signal, from the outcomes this server saw."""

    task_sampler_group_size: int = Field(default=8, ge=2, le=1024)
    """The curriculum's G: the trainer's generations per prompt."""

    @field_validator("tasks", mode="before")
    @classmethod
    def _parse_tasks(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    results_max_rollouts: int = Field(default=100_000, ge=0)
    """Retention: the newest this many rollouts are kept (0: no cap)."""

    results_max_age_days: float = Field(default=0.0, ge=0)
    """Retention: rollouts older than this many days are removed (0: no age limit)."""

    enable_web_interface: bool = True
    """Serve the Gradio tab at /web (`/` redirects there); needs the `ui` extra (gradio)."""

    web_max_events: int = Field(default=2000, ge=10)
    """Lines of the live phase log the web tab keeps per rollout (older lines are dropped)."""

    loop_watchdog: bool = True
    """Watch the event loop (`aio_watchdog`): its lag measured continuously, a stall logged with the stack and
    task that held it, the figures served at `/health/loop`."""

    loop_tick_ms: float = Field(default=50.0, gt=0, le=10_000)
    """How often the watchdog's tick runs on the loop (its lateness is the lag) and its thread looks."""

    loop_stall_warn_ms: float = Field(default=250.0, gt=0)
    """A loop held this long or longer is a stall: counted, and logged once with what held it."""

    api_token: SecretStr | None = None
    """The caller credential (env API_TOKEN). When set, every door that runs or reads anything answers only a
    request carrying it (`Authorization: Bearer <token>`, or `X-API-Token: <token>` where a gateway in front uses
    `Authorization` for itself; the web tab asks for it as its password): `api.caller_auth`. `/health`,
    `/metadata` and `/schema` stay open; the relay's public route keeps its per-rollout tokens."""

    @field_validator("api_token")
    @classmethod
    def _token_not_blank(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().strip():
            raise ValueError("is empty: unset it, or give the caller token (a long random value)")
        return value

    metrics_enabled: bool = True
    """Serve the server's Prometheus metrics at `GET /metrics` (`observe.metrics`); off: it answers 404."""

    metrics_token: SecretStr | None = None
    """When set (env METRICS_TOKEN), `GET /metrics` answers only a request carrying `Authorization: Bearer
    <token>` (401 otherwise); unset: `/metrics` is a door like the others (the caller token when `api_token` is
    set, else anyone who reaches the server may scrape it)."""

    ws_max_message_bytes: int = 16 * _MIB
    """Largest WebSocket frame or /mcp request body accepted; a larger frame closes the connection (1009)."""

    ws_compression: bool = False
    """Offer per-message deflate on WebSockets. Off by default: frames are small and compressing them costs
    more latency than it saves on loopback and LAN links (OpenEnv's validator disables it too)."""

    max_json_depth: int = 64
    """Deepest nesting accepted in a WebSocket frame or JSON-RPC body."""

    # The built-in catalog entries read the variables OpenEnv's opencode_env / pi_env read, with their defaults,
    # so an upstream Space's settings carry over.
    openai_base_url: str = "https://api.openai.com/v1"
    openai_api_key: SecretStr | None = None
    openai_model: str = "gpt-4o-mini"
    """The `openai` catalog entry (env OPENAI_BASE_URL, OPENAI_API_KEY, OPENAI_MODEL)."""

    hf_router_base_url: str = "https://router.huggingface.co/v1"
    hf_router_api_key: SecretStr | None = None
    hf_token: SecretStr | None = None
    hf_router_model: str = "Qwen/Qwen3-4B-Instruct-2507:nscale"
    """The `hf_router` catalog entry (env HF_ROUTER_BASE_URL, HF_ROUTER_MODEL, and HF_ROUTER_API_KEY or else
    HF_TOKEN)."""

    vllm_base_url: str = "http://127.0.0.1:8000/v1"
    vllm_url: str | None = None
    vllm_api_key: SecretStr | None = None
    vllm_model: str = "Qwen/Qwen3.5-4B"
    """The `vllm` catalog entry (env VLLM_BASE_URL, or VLLM_URL with `/v1` added when missing; VLLM_API_KEY,
    VLLM_MODEL); no key needed by default, and thinking is off unless a request asks for it."""

    default_agent: Literal["opencode", "pi", "terminus", "qwen-code", "mini-swe-agent", "claude-code", "codex", "gemini-cli", "oracle", "nop"] = "opencode"
    """The agent a request that names none runs (env DEFAULT_AGENT): `pi` makes this server a drop-in for
    OpenEnv's `pi_env`, whose client does not send one."""

    llm_endpoints: dict[str, LlmEndpoint] = Field(default_factory=dict)
    """Operator-defined catalog entries by name (env LLM_ENDPOINTS as a JSON object); they may override built-ins."""

    llm_default_endpoint: str | None = None
    """Catalog entry used when a request names neither `endpoint` nor `base_url`; None: the request must."""

    relay_public_url: str | None = None
    """The relay's public route as remote sandboxes reach it (env RELAY_PUBLIC_URL), e.g.
    `https://user-space.hf.space/llm/v1`. Unset: derived from `SPACE_HOST` on a Hugging Face Space, else the
    relay's own loopback listener (an engine on this host)."""

    space_host: str | None = None
    """Set by Hugging Face Spaces (env SPACE_HOST): the Space's public host name."""

    relay_max_calls_per_token: int = Field(default=16, ge=1)
    """LLM calls one rollout may have in flight at once (429 beyond)."""

    relay_max_body_bytes: int = 32 * _MIB
    """Largest request body an agent may send to the relay (413 beyond)."""

    relay_max_response_bytes: int = 64 * _MIB
    """Largest non-streamed upstream response the relay reads; also caps each streamed SSE event it records."""

    relay_connect_timeout_s: float = 10.0
    """Deadline for connecting to the upstream."""

    relay_read_timeout_s: float = 600.0
    """Longest silence allowed while waiting for upstream bytes (headers or the next stream chunk)."""

    relay_max_connections: int = 256
    """Upstream connections the relay keeps open at once, across all rollouts."""

    relay_max_turns: int = 10_000
    """LLM calls one rollout may make through the relay (429 beyond)."""

    relay_max_error_chars: int = 2000
    """Characters of an upstream error body kept in a turn."""

    gate_max_body_bytes: int = 32 * _MIB
    """Largest request body an agent may send to a gate (413 beyond)."""

    gate_request_timeout_s: float = 900.0
    """How long a gate call waits for the trainer's answer before it gets 504."""

    sandbox_allow_host_network: bool = False
    """Whether a sandbox may get network policy `host` (the host's network). Operator opt-in only."""

    remote_sandbox_lifetime_s: int = 6 * 3600
    """Lifetime asked of a remote sandbox (HF Job timeout, E2B sandbox timeout): longer than any rollout's
    deadline, so the engine ends one that a crashed server left behind."""

    @field_validator("llm_endpoints", mode="before")
    @classmethod
    def _parse_json(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise ValueError(f"not a JSON object: {exc}") from None
        return value

    @model_validator(mode="after")
    def _one_vllm_url(self) -> Settings:
        both = self.vllm_url is not None and "vllm_base_url" in self.model_fields_set
        if both and self.vllm_endpoint_url != self.vllm_base_url.rstrip("/"):
            raise ValueError("vllm_base_url and vllm_url (the same setting) differ: set one")
        return self

    @property
    def public_relay_url(self) -> str | None:
        """The relay's public base URL (ending in /v1) for remote sandboxes, when this server has one."""
        if self.relay_public_url:
            return self.relay_public_url.rstrip("/")
        if self.space_host:
            return f"https://{self.space_host}{PUBLIC_RELAY_PATH}"
        return None

    @property
    def vllm_endpoint_url(self) -> str:
        """The `vllm` entry's base URL: VLLM_URL (OpenEnv's name, `/v1` added when missing) or VLLM_BASE_URL."""
        if self.vllm_url is None:
            return self.vllm_base_url
        url = self.vllm_url.rstrip("/")
        return url if url.endswith("/v1") else url + "/v1"

    @field_validator("backends")
    @classmethod
    def _one_of_each(cls, value: tuple[BackendConfig, ...]) -> tuple[BackendConfig, ...]:
        if not value:
            raise ValueError("at least one sandbox backend must be enabled")
        kinds = [config.kind for config in value]
        if len(set(kinds)) != len(kinds):
            raise ValueError(f"each sandbox backend may be enabled once: {', '.join(kinds)}")
        return value

    @property
    def configured_secrets(self) -> tuple[str, ...]:
        """The environment variables of the operator secrets these settings hold (a key of an `LLM_ENDPOINTS`
        entry as `LLM_ENDPOINTS.<name>`): while any is set, no command runs unisolated unless the operator says
        so twice (`LocalConfig.allow_unisolated_with_secrets`)."""
        names = [name.upper() for name, value in self if isinstance(value, SecretStr)]
        names += [f"LLM_ENDPOINTS.{name}" for name, entry in self.llm_endpoints.items() if entry.api_key is not None]
        for config in self.backends:
            names += [config.ENV.get(name, name.upper()) for name, value in config if isinstance(value, SecretStr)]
        return tuple(names)

    @property
    def sandbox_backends(self) -> tuple[str, ...]:
        """Names of the enabled backends, the default first."""
        return tuple(config.kind for config in self.backends)

    @property
    def default_backend(self) -> str:
        return self.backends[0].kind

    def backend_config(self, name: str) -> BackendConfig:
        """The configuration of enabled backend `name`; `UnknownBackendError` if it is not enabled."""
        for config in self.backends:
            if config.kind == name:
                return config
        enabled = ", ".join(self.sandbox_backends)
        raise UnknownBackendError(f"sandbox backend {name!r} is not enabled on this server (enabled: {enabled})")

    def with_backends(self, *configs: BackendConfig) -> Settings:
        """These settings with `configs` as the enabled backends (validated)."""
        return self.model_validate({**dict(self), "backends": configs})

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Build settings from `environ` (default `os.environ` and the secrets handed over when this server hid
        them, `settings.secrets`); keyword overrides win."""
        env = {**os.environ, **secrets.handed_over()} if environ is None else environ
        values: dict[str, Any] = {
            name: env[name.upper()] for name in cls.model_fields if name != "backends" and name.upper() in env
        }
        if "backends" not in overrides:
            values["backends"] = _backends_from_env(env)
        values.update(overrides)
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            raise SettingsError(f"invalid settings: {_problems(exc, lambda loc: loc.upper())}") from exc


class SettingsSection:
    """A dataclass of one room's limits, each field `name` defined in `Settings` (once) as `<PREFIX><name>`."""

    PREFIX: ClassVar[str]

    @classmethod
    def from_settings(cls: type[_Section], settings: Settings) -> _Section:
        return cls(**{item.name: getattr(settings, cls.PREFIX + item.name) for item in dataclasses.fields(cls)})


def _backends_from_env(env: Mapping[str, str]) -> tuple[BackendConfig, ...]:
    """The configs of the backends `SANDBOX_BACKENDS` names, each from its own variables; `SettingsError`."""
    names = [part.strip() for part in env.get("SANDBOX_BACKENDS", "local").split(",") if part.strip()]
    if not names:
        raise SettingsError("invalid settings: SANDBOX_BACKENDS: at least one sandbox backend must be enabled")
    configs = []
    for name in names:
        model = BACKEND_KINDS.get(name)
        if model is None:
            known = ", ".join(BACKEND_KINDS)
            raise SettingsError(f"invalid settings: SANDBOX_BACKENDS: unknown sandbox backend {name!r} (known: {known})")
        try:
            configs.append(model.model_validate(model.env_values(env)))
        except ValidationError as exc:
            raise SettingsError(f"invalid settings: {_problems(exc, lambda loc: model.ENV.get(loc, loc))}") from exc
    return tuple(configs)  # type: ignore[arg-type]


def _problems(exc: ValidationError, variable: Callable[[str], str]) -> str:
    """One line naming each invalid value by its environment variable."""
    return "; ".join(
        f"{variable('.'.join(str(p) for p in err['loc']))}: {err['msg']}" for err in exc.errors()
    )
