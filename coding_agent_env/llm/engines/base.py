"""What an inference engine adapter says: how to ask it for token ids and logprobs, where they come back, and
what it refuses.

An `Engine` is stateless and pure (no I/O), except `prompt_ids_request`, which names the follow-up calls that
obtain prompt ids an engine does not return with its answer (llama.cpp's); the exchange makes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Engine", "IdsFound", "PromptIdsRequest", "has_tools"]


def has_tools(body: dict[str, Any]) -> bool:
    tools = body.get("tools")
    return isinstance(tools, list) and len(tools) > 0


@dataclass(frozen=True)
class IdsFound:
    """Token ids an engine put in one answer (or one streamed chunk); None where it put none."""

    prompt: list[Any] | None = None
    completion: list[Any] | None = None


@dataclass(frozen=True)
class PromptIdsRequest:
    """How to obtain the prompt ids of the exact request sent (see `Engine.prompt_ids_request`)."""

    source: str
    """What the turn says of where they came from, e.g. `llamacpp:/apply-template+/tokenize`."""


class Engine:
    """The default: an OpenAI-compatible engine that returns no ids (a hosted API). Subclasses override."""

    name = "openai"
    checked = "OpenAI chat completions API shape (no engine run here)"
    """The engine version and how the adapter was checked: what the engines table of docs/concepts/llm-relay.md says."""

    def ask(self, body: dict[str, Any], *, top_logprobs: int, token_ids: bool) -> None:
        """Add, in place, what asks for logprobs (and ids where the engine has a switch). `token_ids`: the
        endpoint says it understands vLLM's `return_token_ids` (an unknown engine's one hint)."""
        body["logprobs"] = True
        if top_logprobs > 0:
            body["top_logprobs"] = top_logprobs

    def buffers(self, body: dict[str, Any]) -> bool:
        """Whether this (streamed) request, with what `ask` added, must be sent not streamed because the engine
        refuses the combination; the relay then streams the answer to the agent itself."""
        return False

    def ids(self, obj: dict[str, Any], choice: dict[str, Any]) -> IdsFound:
        """The ids in one answer or chunk (`obj`) and its choice 0 (`choice`, {} when none)."""
        return IdsFound()

    def policy_version(self, obj: dict[str, Any]) -> Any:
        """The weight version the engine says produced this answer (or chunk), as it wrote it (the caller checks
        it, `models.turns.policy_version_or_none`); None where the engine puts none in its body. Every engine's
        `X-Policy-Version` response header is read by the exchange and wins over this."""
        return None

    def prompt_ids_request(self, body: dict[str, Any]) -> PromptIdsRequest | None:
        """When the engine does not return prompt ids but can be asked for them afterwards, how."""
        return None

    def detects(self, obj: dict[str, Any]) -> bool:
        """Whether an answer (or chunk) is unmistakably this engine's (used when the endpoint does not say)."""
        return False

    def refusal_is_ours(self, status: int, message: str) -> bool:
        """Whether an error answer is this engine refusing what the relay added (not the agent's request)."""
        return False
