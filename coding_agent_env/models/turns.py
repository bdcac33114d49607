"""What the relay records of each LLM call (`Turn`), and what a trainer takes from a rollout (`TrainingData`)."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field

from coding_agent_env.models.common import NativeDialect, WireModel
from coding_agent_env.settings import WireLimits

__all__ = [
    "POLICY_VERSION_PATTERN", "ToolCall", "TrainingData", "TrainingSequence", "Turn", "TurnMessage", "TurnPurpose",
    "Usage", "policy_version_or_none",
]

POLICY_VERSION_PATTERN = r"^[!-~]+$"
"""A policy version is visible ASCII (no spaces, no control characters), at most `WireLimits.MAX_NAME_CHARS`
long: the request's field, a live lease's update and an engine's report all obey it."""
_POLICY_VERSION = re.compile(r"[!-~]+")  # with fullmatch: Python's `$` would let a trailing newline through


def policy_version_or_none(value: object) -> str | None:
    """`value` when it is a valid policy version (see `POLICY_VERSION_PATTERN`), else None. Total: any value,
    e.g. an upstream's header or body field, is checked without raising."""
    if isinstance(value, str) and 0 < len(value) <= WireLimits.MAX_NAME_CHARS and _POLICY_VERSION.fullmatch(value):
        return value
    return None


class ToolCall(WireModel):
    id: str | None = None
    name: str | None = None
    arguments: str = ""


class TurnMessage(WireModel):
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)


class Usage(WireModel):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None


TurnPurpose = Literal["main", "retry", "subagent", "auxiliary", "compaction"]


class Turn(WireModel):
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
    policy_version: str | None = Field(
        default=None, max_length=WireLimits.MAX_NAME_CHARS, pattern=POLICY_VERSION_PATTERN,
        description="The trainer's policy / weight version that produced the call: what the engine reported for it "
        "(its `X-Policy-Version` response header, else a body field its adapter reads, e.g. SGLang's "
        "`metadata.weight_version`), else the rollout's (the request's `policy_version`, or the lease's update). "
        "Null when neither says.",
    )
    passthrough: NativeDialect | None = Field(
        default=None,
        description="The dialect the call went upstream in unchanged (the upstream speaks it natively); null: sent "
        "as chat completions. The message, tool calls, finish reason and usage are read back from that dialect.",
    )
    engine: str | None = Field(
        default=None, description="The inference engine of the call (vllm, sglang, llamacpp, openai): the "
        "endpoint's, or detected from its answers; null when unknown (transparent_proxy only).")
    upstream_call: str | None = Field(
        default=None, description="How the relay called the upstream when not as the agent asked: not streamed "
        "(the engine refuses the streamed form; the relay streamed the answer to the agent), or again after the "
        "upstream refused what the relay added (its status and message). Null: as asked.")
    prompt_ids_source: str | None = Field(
        default=None, description="Where prompt_token_ids came from: 'engine' (in its answer), or how they were "
        "obtained from it for the exact request sent (e.g. 'llamacpp:/apply-template+/tokenize'), or why not.")
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


class TrainingSequence(WireModel):
    """One root-to-leaf path of the rollout graph as one token sequence, ready for a trainer."""

    node_ids: list[str]
    purpose: TurnPurpose = Field(description="The purpose of the path's last call.")
    input_ids: list[int] = Field(description="The last call's prompt ids followed by its sampled ids.")
    loss_mask: list[int] = Field(description="1 on the sampled tokens of trainable calls along the path, else 0.")
    logprobs: list[float] = Field(description="The sampler's logprob at each sampled position, 0.0 elsewhere.")


class TrainingData(WireModel):
    """What a trainer needs from a rollout (see `llm.trace`)."""

    trace: dict[str, Any] = Field(
        description="A training trace (`schema_version`, `turns`) that OpenEnv 0.10's "
        "`openenv.core.harness.training.TrainingTrace.model_validate` accepts unchanged: each call with prompt "
        "token ids, with `node_id`, its ids and logprobs and a `loss_mask` over prompt plus completion."
    )
    sequences: list[TrainingSequence] = Field(default_factory=list)
    reward: float | None = Field(default=None, description="The rollout's reward; null when unscored, never 0.")
