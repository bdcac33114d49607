"""`RolloutRequest`: the `run_rollout` tool's arguments, a `Task` and the agent and endpoint that attempt it.

Its wire shape is flat (the task's fields beside the agent's), as upstream's clients send it. Whether a named
agent, backend or endpoint is *available* is the server's business, checked by the pipeline against `Settings`.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, get_args

from pydantic import Field, SecretStr, ValidationError, model_validator

from coding_agent_env.models.task import Task
from coding_agent_env.models.common import Mode, NativeDialect, name_field
from coding_agent_env.models.turns import POLICY_VERSION_PATTERN
from coding_agent_env.settings import WireLimits

__all__ = ["AGENT_NAMES", "AgentName", "RolloutRequest", "request_fields_schema", "validation_summary"]

AgentName = Literal[
    "opencode", "pi", "terminus", "qwen-code", "mini-swe-agent", "claude-code", "codex", "gemini-cli", "oracle", "nop"
]
"""Agents a request may name (the schema's enum). Which of them this server can run is the agent registry's."""
AGENT_NAMES: tuple[str, ...] = get_args(AgentName)


class RolloutRequest(Task):
    """One episode: a task (instruction, files, setup, verify), an agent, an endpoint and a sandbox."""

    UNSET_WHEN_EMPTY: ClassVar[frozenset[str]] = Task.UNSET_WHEN_EMPTY | {
        "endpoint", "base_url", "api_key", "model", "agent", "disable_thinking", "max_tokens_cap", "policy_version"
    }

    agent: AgentName | None = Field(
        default=None,
        description=f"Agent to run: {', '.join(AGENT_NAMES[:-2])} (LLM agents), oracle (runs `solution`) or nop; "
        "default: the server's (DEFAULT_AGENT, opencode unless set).",
    )
    endpoint: str | None = name_field(
        "Name of an LLM endpoint in the server's catalog (openai, vllm, hf_router, ...); "
        "alternative to base_url + api_key + model."
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
    model: str | None = name_field("Model id, e.g. Qwen/Qwen3-4B.")
    mode: Mode = Field(
        default=Mode.BLACK_BOX,
        description="black_box records turns; transparent_proxy also asks the upstream for logprobs and token ids.",
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
    policy_version: str | None = Field(
        default=None,
        max_length=WireLimits.MAX_NAME_CHARS,
        pattern=POLICY_VERSION_PATTERN,
        description="The trainer's policy / weight version serving this rollout's LLM calls (visible ASCII, no "
        "spaces); recorded on every turn and in the training trace. An engine's own report for a call (its "
        "X-Policy-Version response header) wins for that call.",
    )
    native_dialects: list[NativeDialect] = Field(
        default_factory=list,
        max_length=3,
        description="Agent dialects the upstream serves itself: a call in one goes upstream unchanged (model and "
        "max_tokens_cap applied) instead of translated to chat completions: anthropic at {base_url}/messages, "
        "responses at {base_url}/responses, google at {base_url}/models/MODEL:generateContent. Default: the "
        "endpoint's (LLM_ENDPOINTS native_dialects); none for a caller-supplied base_url.",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_token_cap(cls, data: Any) -> Any:
        """Upstream's `max_tokens_cap: 0` means no cap."""
        if isinstance(data, dict) and data.get("max_tokens_cap") == 0:
            data = {key: value for key, value in data.items() if key != "max_tokens_cap"}
        return data

    @model_validator(mode="after")
    def _endpoint_consistent(self) -> RolloutRequest:
        if self.base_url is not None and self.api_key is None:
            raise ValueError("a caller-supplied base_url requires a caller-supplied api_key")
        return self

    @classmethod
    def for_task(cls, task: Task, **agent: Any) -> RolloutRequest:
        """The request that runs `task` with the agent and endpoint fields `agent` (validated as on the wire)."""
        return cls.model_validate({**task.model_dump(include=set(Task.model_fields), exclude_unset=True), **agent})


def request_fields_schema() -> dict[str, Any]:
    """JSON schema of the request's fields (the `run_rollout` tool's input schema)."""
    return RolloutRequest.model_json_schema()


def validation_summary(exc: ValidationError) -> str:
    """One line naming each bad field and why, without echoing the values (they may hold secrets)."""
    parts = [f"{'.'.join(str(p) for p in err['loc']) or 'arguments'}: {err['msg']}" for err in exc.errors()[:5]]
    more = f" (and {exc.error_count() - 5} more)" if exc.error_count() > 5 else ""
    return "; ".join(parts) + more
