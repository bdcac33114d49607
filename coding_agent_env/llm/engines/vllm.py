"""vLLM's OpenAI-compatible server.

Asked for: `logprobs` (and `top_logprobs`), and `return_token_ids: true` (vLLM >= 0.10.2).
Returned: prompt ids in the answer's top-level `prompt_token_ids` (streamed: in the first chunk), completion ids
in `choices[0].token_ids` (streamed: per chunk); or, with `--return-tokens-as-token-ids`, each logprob's
`token` spelled `token_id:N`. Streamed calls with tools and logprobs are accepted.
Weight version: no field for it in its documented chat answer (`ChatCompletionResponse`; its docs searched for a
weight or policy version in answers, none found), so only an `X-Policy-Version` header (from a router or proxy in
front of it) reports one.
Checked against: vLLM's documented wire shapes (`ChatCompletionResponse.prompt_token_ids`,
`ChatCompletionResponseChoice.token_ids`, `stop_reason`), served by the test fake `tests/fakes/llm.py`; no GPU
here to run vLLM itself.
"""

from __future__ import annotations

from typing import Any

from coding_agent_env.llm.engines.base import Engine, IdsFound

__all__ = ["ENGINE", "Vllm"]


class Vllm(Engine):
    name = "vllm"
    checked = "vLLM >= 0.10.2 documented shapes, via tests/fakes (no GPU here)"

    def __init__(self, *, always_ids: bool = True) -> None:
        self._always_ids = always_ids

    def ask(self, body: dict[str, Any], *, top_logprobs: int, token_ids: bool) -> None:
        super().ask(body, top_logprobs=top_logprobs, token_ids=token_ids)
        if token_ids or self._always_ids:
            body["return_token_ids"] = True

    def ids(self, obj: dict[str, Any], choice: dict[str, Any]) -> IdsFound:
        prompt = obj.get("prompt_token_ids")
        completion = choice.get("token_ids")
        return IdsFound(prompt if isinstance(prompt, list) else None,
                        completion if isinstance(completion, list) else None)

    def detects(self, obj: dict[str, Any]) -> bool:
        # `stop_reason` on a choice is vLLM's own field (always serialised by it); prompt ids at the top level
        # too, but only when asked for.
        choices = obj.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        return "stop_reason" in choice or "kv_transfer_params" in obj


ENGINE = Vllm()
GENERIC = Vllm(always_ids=False)
"""An endpoint whose engine is not known (yet): what the relay always did, vLLM's fields read wherever they
are, `return_token_ids` asked for only where the endpoint says it understands it."""
