"""SGLang's OpenAI-compatible server (>= 0.5.13, its "token in, token out" chat extensions).

Asked for: `logprobs` (and `top_logprobs`), `return_prompt_token_ids: true` and `return_meta_info: true`.
SGLang refuses both extensions on a streamed call (400 "... is not supported with streaming"), so a streamed
call is sent not streamed and the relay streams the answer to the agent itself.
Returned: prompt ids in `choices[0].prompt_token_ids`; completion ids in `choices[0].meta_info`:
`output_token_logprobs` entries `[logprob, token_id, text]` (or `{"token_id"|"id", "logprob"}`), else
`output_ids`; `matched_stop` on each choice is SGLang's own field.
Weight version: a whole chat answer carries `metadata.weight_version` (serving_chat builds
`ChatCompletionResponse(..., metadata={"weight_version": meta_info["weight_version"]})`; the label of the last
`/update_weights_from_disk|tensor|distributed` call's `weight_version`, `ServerArgs.weight_version` "default" when
none was given; SGLang's "SGLang for RL" docs list that request field); streamed chunks carry none
(`ChatCompletionStreamResponse` has no `metadata`), but a transparent_proxy call is sent not streamed anyway.
"default" is read as no report (the rollout's own version then stands): read from SGLang's public source
and docs, not from a running SGLang.
Checked against: SGLang's serving_chat/protocol source (0.5.13 tree) and the fake `tests/fakes/engines.py`
speaking that shape; no GPU here to run SGLang itself.
"""

from __future__ import annotations

from typing import Any

from coding_agent_env.llm.engines.base import Engine, IdsFound

__all__ = ["ENGINE", "Sglang"]

_UNLABELLED = "default"
"""SGLang's `weight_version` when no update ever named one (`ServerArgs.weight_version`'s default)."""


class Sglang(Engine):
    name = "sglang"
    checked = "SGLang 0.5.13 source (serving_chat, protocol), via tests/fakes/engines.py (no GPU here)"

    def ask(self, body: dict[str, Any], *, top_logprobs: int, token_ids: bool) -> None:
        super().ask(body, top_logprobs=top_logprobs, token_ids=token_ids)
        body["return_prompt_token_ids"] = True
        body["return_meta_info"] = True

    def buffers(self, body: dict[str, Any]) -> bool:
        return body.get("stream") is True

    def ids(self, obj: dict[str, Any], choice: dict[str, Any]) -> IdsFound:
        prompt = choice.get("prompt_token_ids")
        meta = choice.get("meta_info")
        completion: list[Any] | None = None
        if isinstance(meta, dict):
            entries = meta.get("output_token_logprobs")
            if isinstance(entries, list) and entries:
                completion = [_entry_id(entry) for entry in entries]
            elif isinstance(meta.get("output_ids"), list):
                completion = meta["output_ids"]
        if completion is None and isinstance(choice.get("token_ids"), list):
            completion = choice["token_ids"]
        return IdsFound(prompt if isinstance(prompt, list) else None, completion)

    def policy_version(self, obj: dict[str, Any]) -> Any:
        metadata = obj.get("metadata")
        version = metadata.get("weight_version") if isinstance(metadata, dict) else None
        return None if version == _UNLABELLED else version

    def detects(self, obj: dict[str, Any]) -> bool:
        choices = obj.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        return "matched_stop" in choice

    def refusal_is_ours(self, status: int, message: str) -> bool:
        return status == 400 and "not supported with streaming" in message


def _entry_id(entry: Any) -> Any:
    """One `output_token_logprobs` entry's token id (None, so the ids are refused as garbage, when absent)."""
    if isinstance(entry, dict):
        return entry.get("token_id", entry.get("id"))
    if isinstance(entry, (list, tuple)) and len(entry) >= 2:
        return entry[1]
    return None


ENGINE = Sglang()
