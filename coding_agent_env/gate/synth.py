"""Turn a delivered chat completion into what the agent asked for: JSON, or an SSE stream.

`normalize_completion` validates the trainer's answer once, at `deliver()` time, so a malformed answer is the
trainer's error (`InvalidResponseError`), not the agent's. `sse_events` renders it the way OpenAI streams:
role chunk, reasoning, content (with logprobs and vLLM token ids when given), tool-call deltas, finish
chunk, usage chunk (when the request asked for usage), `[DONE]`. OpenCode, Pi and the `openai` client
accept it.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from typing import Any

from coding_agent_env.errors import InvalidResponseError

__all__ = ["normalize_completion", "sse_events"]


def normalize_completion(response: Any, model: str | None) -> dict[str, Any]:
    """A `chat.completion` dict from a mapping or an object with `model_dump()` (e.g. openai's)."""
    if hasattr(response, "model_dump"):
        response = response.model_dump(exclude_none=True)
    if not isinstance(response, Mapping):
        raise InvalidResponseError("a delivered response must be a chat completion mapping")
    out = dict(response)
    choices = out.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        raise InvalidResponseError("a delivered response needs a non-empty 'choices' list")
    message = choices[0].get("message")
    if not isinstance(message, Mapping):
        raise InvalidResponseError("choices[0] needs a 'message' object")
    for call in message.get("tool_calls") or []:
        if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
            raise InvalidResponseError("each tool call needs a 'function' object")
    out.setdefault("id", f"chatcmpl-{uuid.uuid4().hex}")
    out.setdefault("object", "chat.completion")
    out.setdefault("created", int(time.time()))
    out.setdefault("model", model or "unknown")
    out["choices"] = [{"index": 0, "finish_reason": "stop", **dict(choices[0])}, *choices[1:]]
    try:
        json.dumps(out)
    except (TypeError, ValueError) as exc:
        raise InvalidResponseError(f"a delivered response must be JSON-serialisable: {exc}") from None
    return out


def sse_events(completion: dict[str, Any], include_usage: bool) -> list[bytes]:
    """The SSE byte strings (one per event, `[DONE]` last) for a normalised completion."""
    head = {"id": completion["id"], "object": "chat.completion.chunk", "created": completion["created"],
            "model": completion["model"]}
    choice = completion["choices"][0]
    message = choice["message"]

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, **extra}]}

    first = chunk({"role": "assistant", "content": ""})
    if "prompt_token_ids" in completion:
        first["prompt_token_ids"] = completion["prompt_token_ids"]
    chunks = [first]
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning:
        chunks.append(chunk({"reasoning_content": reasoning}))
    extras = {key: choice[key] for key in ("logprobs", "token_ids") if choice.get(key) is not None}
    if message.get("content") or extras:
        chunks.append(chunk({"content": message.get("content") or ""}, **extras))
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call["function"]
        delta = {"index": index, "id": call.get("id") or f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                 "function": {"name": function.get("name", ""), "arguments": function.get("arguments", "")}}
        chunks.append(chunk({"tool_calls": [delta]}))
    chunks.append(chunk({}, choice.get("finish_reason") or "stop"))
    if include_usage and completion.get("usage") is not None:
        chunks.append({**head, "choices": [], "usage": completion["usage"]})
    return [f"data: {json.dumps(c)}\n\n".encode() for c in chunks] + [b"data: [DONE]\n\n"]
