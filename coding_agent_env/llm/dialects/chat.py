"""The chat-completions side every dialect translates to and from: reading a chat answer's first choice, building a
chat completion from a dialect's answer (the read-backs), and the small total coercions both need. Pure, no I/O."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["ChatBuilder", "arguments_object", "as_count", "as_dict", "as_list", "as_str", "first_choice", "sse",
           "token_counts"]


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def as_str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def as_count(value: Any) -> int:
    """A token count as given, or 0 when it is not a non-negative integer."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def first_choice(chat: dict[str, Any], part: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A chat completion's (or chunk's) choice 0 and its `part` (`message`, or a chunk's `delta`); {} for what is
    missing or malformed (agents ask for one choice)."""
    choices = chat.get("choices") if isinstance(chat.get("choices"), list) else []
    choice = choices[0] if choices and isinstance(choices[0], dict) else {}
    return choice, as_dict(choice.get(part))


def token_counts(usage: Any) -> tuple[int, int]:
    """(prompt, completion) tokens of a chat `usage` object; 0 for what it lacks."""
    usage = as_dict(usage)
    return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)


def arguments_object(arguments: Any) -> dict[str, Any]:
    """A chat tool call's JSON-string arguments as the object dialects carry; arguments that are not a JSON object
    become `{"arguments": <the raw string>}` rather than failing the call."""
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) and arguments else {}
    except ValueError:
        return {"arguments": arguments}
    return parsed if isinstance(parsed, dict) else {"arguments": arguments}


def sse(data: dict[str, Any], event: str | None = None) -> bytes:
    """One server-sent event: compact JSON `data`, after an `event:` line when the dialect names its events."""
    line = f"data: {json.dumps(data, separators=(',', ':'))}\n\n"
    return (f"event: {event}\n" + line if event is not None else line).encode()


class ChatBuilder:
    """The chat completion a read-back puts together: text, reasoning and tool calls as they come, a finish reason
    in chat's words (None: `tool_calls` when it called one, else `stop`), token counts."""

    def __init__(self) -> None:
        self.model: str | None = None
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.calls: list[dict[str, Any]] = []
        self.finish: str | None = None
        self.prompt_tokens = 0
        self.completion_tokens = 0

    def call(self, call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
        """Add a tool call (arguments as a JSON string, or any value to serialise) and return its entry, whose
        arguments a stream may still complete."""
        text = arguments if isinstance(arguments, str) else json.dumps(arguments if arguments is not None else {})
        entry = {"id": as_str(call_id) or f"call_{len(self.calls)}", "type": "function",
                 "function": {"name": as_str(name), "arguments": text}}
        self.calls.append(entry)
        return entry

    def completion(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.text) if self.text else None}
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        if self.calls:
            message["tool_calls"] = self.calls
        finish = self.finish or ("tool_calls" if self.calls else "stop")
        return {"object": "chat.completion", "model": self.model,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                          "total_tokens": self.prompt_tokens + self.completion_tokens}}
