"""A dialect's own answers read back as a chat completion, for recording a call passed through to an upstream
that speaks the dialect natively (the reverse of each module's `response_from_chat` / stream translator). Pure,
no I/O, and total: any JSON may be fed; what cannot be read stays empty.

`whole(name, body)` reads a whole response; `recorder(name)` gives an object fed each streamed event (the JSON of
one SSE `data:` line) whose `completion()` is the call's chat completion so far. The result is what
`capture.TurnAssembler.add_response` reads: `model`, one choice with `message` (`content`, `reasoning_content`,
`tool_calls` with JSON-string arguments), `finish_reason` in chat's words, and `usage`.

Finish reasons: Anthropic end_turn / stop_sequence / pause_turn -> stop, max_tokens -> length, tool_use ->
tool_calls, refusal -> content_filter; Responses incomplete (max_output_tokens) -> length, content_filter ->
content_filter, else tool_calls when it called a function, else stop; Google MAX_TOKENS -> length, SAFETY /
RECITATION / BLOCKLIST / PROHIBITED_CONTENT / SPII -> content_filter, else tool_calls when it called one, else stop.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

__all__ = ["Recorder", "recorder", "whole"]

_ANTHROPIC_STOP = {"end_turn": "stop", "stop_sequence": "stop", "pause_turn": "stop", "max_tokens": "length",
                   "tool_use": "tool_calls", "refusal": "content_filter"}
_GOOGLE_FILTERED = frozenset({"SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY"})


class Recorder(Protocol):
    def feed(self, event: Any) -> None: ...

    def completion(self) -> dict[str, Any]: ...


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _arguments(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value if value is not None else {})


class _Message:
    """The chat completion being put together."""

    def __init__(self) -> None:
        self.model: str | None = None
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.calls: list[dict[str, Any]] = []
        self.finish: str | None = None
        self.prompt_tokens = 0
        self.completion_tokens = 0

    def call(self, call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
        entry = {"id": _str(call_id) or f"call_{len(self.calls)}", "type": "function",
                 "function": {"name": _str(name), "arguments": _arguments(arguments)}}
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


# -- Anthropic Messages ----------------------------------------------------------------------------------------


def _anthropic_usage(into: _Message, usage: Any) -> None:
    usage = _dict(usage)
    if "input_tokens" in usage:
        into.prompt_tokens = _int(usage["input_tokens"])
    if "output_tokens" in usage:
        into.completion_tokens = _int(usage["output_tokens"])


def _anthropic_whole(body: dict[str, Any]) -> dict[str, Any]:
    out = _Message()
    out.model = _str(body.get("model")) or None
    for block in _list(body.get("content")):
        block = _dict(block)
        kind = block.get("type")
        if kind == "text":
            out.text.append(_str(block.get("text")))
        elif kind == "thinking":
            out.reasoning.append(_str(block.get("thinking")))
        elif kind == "tool_use":
            out.call(block.get("id"), block.get("name"), block.get("input"))
    out.finish = _ANTHROPIC_STOP.get(_str(body.get("stop_reason")))
    _anthropic_usage(out, body.get("usage"))
    return out.completion()


class _AnthropicRecorder:
    def __init__(self) -> None:
        self._out = _Message()
        self._blocks: dict[int, tuple[str, Any]] = {}  # index -> (kind, text list or call entry)
        self._partial: dict[int, list[str]] = {}

    def feed(self, event: Any) -> None:
        event = _dict(event)
        kind = event.get("type")
        if kind == "message_start":
            message = _dict(event.get("message"))
            self._out.model = _str(message.get("model")) or self._out.model
            _anthropic_usage(self._out, message.get("usage"))
        elif kind == "content_block_start":
            self._start(event.get("index"), _dict(event.get("content_block")))
        elif kind == "content_block_delta":
            self._delta(event.get("index"), _dict(event.get("delta")))
        elif kind == "content_block_stop":
            self._stop(event.get("index"))
        elif kind == "message_delta":
            reason = _str(_dict(event.get("delta")).get("stop_reason"))
            self._out.finish = _ANTHROPIC_STOP.get(reason, self._out.finish)
            _anthropic_usage(self._out, event.get("usage"))

    def _start(self, index: Any, block: dict[str, Any]) -> None:
        if not isinstance(index, int):
            return
        if block.get("type") == "text":
            self._out.text.append(_str(block.get("text")))
            self._blocks[index] = ("text", None)
        elif block.get("type") == "thinking":
            self._out.reasoning.append(_str(block.get("thinking")))
            self._blocks[index] = ("thinking", None)
        elif block.get("type") == "tool_use":
            start = block.get("input")
            self._blocks[index] = ("tool", self._out.call(block.get("id"), block.get("name"), start or {}))
            self._partial[index] = []

    def _delta(self, index: Any, delta: dict[str, Any]) -> None:
        kind = delta.get("type")
        if kind == "text_delta":
            self._out.text.append(_str(delta.get("text")))
        elif kind == "thinking_delta":
            self._out.reasoning.append(_str(delta.get("thinking")))
        elif kind == "input_json_delta" and index in self._partial:
            self._partial[index].append(_str(delta.get("partial_json")))

    def _stop(self, index: Any) -> None:
        if index in self._partial:
            self._finish_call(index)

    def _finish_call(self, index: int) -> None:
        parts = self._partial[index]
        if parts:
            self._blocks[index][1]["function"]["arguments"] = "".join(parts)

    def completion(self) -> dict[str, Any]:
        for index in self._partial:
            self._finish_call(index)
        return self._out.completion()


# -- OpenAI Responses ------------------------------------------------------------------------------------------


def _responses_whole(body: dict[str, Any]) -> dict[str, Any]:
    out = _Message()
    out.model = _str(body.get("model")) or None
    for item in _list(body.get("output")):
        _responses_item(out, _dict(item))
    reason = _str(_dict(body.get("incomplete_details")).get("reason"))
    if body.get("status") == "incomplete":
        out.finish = "content_filter" if reason == "content_filter" else "length"
    usage = _dict(body.get("usage"))
    out.prompt_tokens, out.completion_tokens = _int(usage.get("input_tokens")), _int(usage.get("output_tokens"))
    return out.completion()


def _responses_item(out: _Message, item: dict[str, Any]) -> None:
    kind = item.get("type")
    if kind == "message":
        for part in _list(item.get("content")):
            part = _dict(part)
            if part.get("type") in ("output_text", "text"):
                out.text.append(_str(part.get("text")))
    elif kind == "function_call":
        out.call(item.get("call_id") or item.get("id"), item.get("name"), item.get("arguments") or "")
    elif kind == "reasoning":
        for part in _list(item.get("summary")) + _list(item.get("content")):
            out.reasoning.append(_str(_dict(part).get("text")))


class _ResponsesRecorder:
    """The final event (`response.completed`, `.incomplete` or `.failed`) carries the whole response; until it
    comes (a stream cut short), the items so far are what is known: each as `response.output_item.done` gave it,
    or as its `added` event and the deltas since built it."""

    _DELTAS = {"response.output_text.delta": "_text", "response.refusal.delta": "_text",
               "response.reasoning_summary_text.delta": "_reasoning", "response.reasoning_text.delta": "_reasoning",
               "response.function_call_arguments.delta": "arguments"}

    def __init__(self) -> None:
        self._final: dict[str, Any] | None = None
        self._items: dict[Any, dict[str, Any]] = {}
        self._model: str | None = None

    def feed(self, event: Any) -> None:
        event = _dict(event)
        kind = event.get("type")
        response = _dict(event.get("response"))
        if kind in ("response.completed", "response.incomplete", "response.failed"):
            self._final = response
        elif kind in ("response.output_item.added", "response.output_item.done"):
            item = _dict(event.get("item"))
            self._items[item.get("id") or event.get("output_index")] = {**item, "done": kind.endswith("done")}
        elif kind in self._DELTAS:
            item = self._items.setdefault(event.get("item_id"), {"type": "message", "done": False})
            if not item["done"]:
                key = self._DELTAS[kind]
                item[key] = _str(item.get(key)) + _str(event.get("delta"))
        if response.get("model"):
            self._model = _str(response["model"])

    def completion(self) -> dict[str, Any]:
        final = dict(self._final or {"model": self._model})
        if not _list(final.get("output")):
            final["output"] = [self._as_done(item) for item in self._items.values()]
        return _responses_whole(final)

    @staticmethod
    def _as_done(item: dict[str, Any]) -> dict[str, Any]:
        """An item cut short, in the shape `output_item.done` would have given it."""
        if item["done"]:
            return item
        if item.get("type") == "reasoning":
            return {**item, "summary": [{"type": "summary_text", "text": item.get("_reasoning", "")}]}
        if item.get("type") == "message":
            return {**item, "content": [{"type": "output_text", "text": item.get("_text", "")}]}
        return item


# -- Google generateContent ------------------------------------------------------------------------------------


class _GoogleRecorder:
    """Each chunk of a stream is a GenerateContentResponse; a whole response is one chunk."""

    def __init__(self) -> None:
        self._out = _Message()
        self._reason: str | None = None

    def feed(self, event: Any) -> None:
        event = _dict(event)
        self._out.model = _str(event.get("modelVersion")) or self._out.model
        candidates = _list(event.get("candidates"))
        candidate = _dict(candidates[0]) if candidates else {}
        for part in _list(_dict(candidate.get("content")).get("parts")):
            part = _dict(part)
            call = part.get("functionCall")
            if isinstance(call, dict):
                self._out.call(call.get("id"), call.get("name"), call.get("args"))
            elif isinstance(part.get("text"), str):
                (self._out.reasoning if part.get("thought") is True else self._out.text).append(part["text"])
        if candidate.get("finishReason"):
            self._reason = _str(candidate["finishReason"])
        usage = _dict(event.get("usageMetadata"))
        if usage:
            self._out.prompt_tokens = _int(usage.get("promptTokenCount"))
            self._out.completion_tokens = _int(usage.get("candidatesTokenCount"))

    def completion(self) -> dict[str, Any]:
        if self._reason == "MAX_TOKENS":
            self._out.finish = "length"
        elif self._reason in _GOOGLE_FILTERED:
            self._out.finish = "content_filter"
        return self._out.completion()


def recorder(name: str) -> Recorder:
    """A recorder for one streamed call in dialect `name` (anthropic, responses or google)."""
    if name == "anthropic":
        return _AnthropicRecorder()
    if name == "responses":
        return _ResponsesRecorder()
    if name == "google":
        return _GoogleRecorder()
    raise ValueError(f"no recorder for dialect {name!r}")


def whole(name: str, body: Any) -> dict[str, Any]:
    """The chat completion for a whole response in dialect `name`."""
    body = _dict(body)
    if name == "anthropic":
        return _anthropic_whole(body)
    if name == "responses":
        return _responses_whole(body)
    one = recorder(name)
    one.feed(body)
    return one.completion()
