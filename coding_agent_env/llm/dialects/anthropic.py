"""Anthropic Messages (`POST /v1/messages`) over an upstream that speaks OpenAI chat completions: a pure
translation, request in -> chat request out, chat response (whole or streamed chunks) -> Messages response or
Messages stream events. No I/O.

Requests: `system` (text or text blocks) becomes the system message, as does a `system` message mid-conversation;
user text stays text and several text blocks stay several text parts, `tool_result` blocks become `tool` messages (before the user's remaining text, as the
conversation had them), assistant `text` / `tool_use` blocks become content and `tool_calls` (the input as JSON
arguments), `thinking` blocks are dropped (chat has no way to send them back); `tools` become functions,
`tool_choice` maps (auto, any -> required, tool -> that function, none), `max_tokens`, `temperature`, `top_p`,
`stop_sequences` -> `stop`, `stream`. Images and documents are refused with a `DialectError` (the upstream is
text-only here); so are unknown content block types. Ignored as harmless: `metadata`, `thinking` (the budget),
`top_k`, `service_tier`, `context_management`, `output_config`, `betas`, `cache_control` (on the request and on
blocks).

Responses: text and tool calls become `text` and `tool_use` blocks (arguments parsed as JSON; arguments that are
not a JSON object become `{"arguments": <the raw string>}` rather than failing the call); `finish_reason` maps
stop -> end_turn, length -> max_tokens, tool_calls -> tool_use, anything else -> end_turn; usage maps to
input_tokens / output_tokens. Streams: `message_start`, then per content block `content_block_start`,
`content_block_delta` (`text_delta`, `input_json_delta`), `content_block_stop`, then `message_delta` (stop
reason, usage) and `message_stop`, in the order the real API sends them; `finish()` closes a stream that ended
without a finish reason.

Read-back (a call passed through to an upstream that speaks Messages): `text`, `thinking` and `tool_use` blocks,
whole or streamed (`input_json_delta`s joined); stop reasons end_turn / stop_sequence / pause_turn -> stop,
max_tokens -> length, tool_use -> tool_calls, refusal -> content_filter. Pass-through: `{base_url}/messages`, the
key as `x-api-key`, the agent's `anthropic-version` (2023-06-01 when it sent none) and `anthropic-beta`, the cap on
`max_tokens`.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from coding_agent_env.llm.dialects.base import Dialect, DialectError, Route, refuse_unknown
from coding_agent_env.llm.dialects.chat import ChatBuilder, arguments_object, first_choice, sse, token_counts
from coding_agent_env.llm.dialects.chat import as_count, as_dict, as_list, as_str

__all__ = ["DIALECT", "PATHS", "AnthropicStream", "DialectError", "error_body", "response_from_chat", "to_chat"]

PATHS = frozenset({"/v1/messages", "/messages"})

_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use"}
_IGNORED = frozenset({"metadata", "thinking", "top_k", "service_tier", "container", "mcp_servers", "context_management",
                      "output_config", "betas", "cache_control"})
_KNOWN = frozenset({"model", "messages", "system", "max_tokens", "temperature", "top_p", "stop_sequences",
                    "stream", "tools", "tool_choice"}) | _IGNORED


def error_body(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error shape (which its clients turn into typed errors)."""
    kinds = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
             413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error"}
    return {"type": "error", "error": {"type": kinds.get(status, "api_error"), "message": message}}


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat-completions request for a Messages request; `DialectError` for what cannot be translated."""
    refuse_unknown(body, _KNOWN, "Messages")
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": _text_of(system, "system")})
    raw = body.get("messages")
    if not isinstance(raw, list):
        raise DialectError("messages must be a list")
    for position, message in enumerate(raw):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant", "system"):
            raise DialectError(f"messages[{position}]: role must be user, assistant or system")
        if message["role"] == "system":  # a system message mid-conversation (Claude Code sends them)
            messages.append({"role": "system", "content": _text_of(message.get("content") or "", "system")})
            continue
        messages.extend(_message(message, position))
    out: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    if body.get("max_tokens") is not None:
        out["max_tokens"] = body["max_tokens"]
    for name in ("temperature", "top_p"):
        if body.get(name) is not None:
            out[name] = body[name]
    if body.get("stop_sequences"):
        out["stop"] = list(body["stop_sequences"])
    if body.get("stream") is True:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    tools = body.get("tools")
    if tools:
        out["tools"] = [_tool(tool, i) for i, tool in enumerate(tools)]
    choice = body.get("tool_choice")
    if choice is not None:
        out["tool_choice"] = _tool_choice(choice)
    return out


def _message(message: dict[str, Any], position: int) -> list[dict[str, Any]]:
    role, content = message["role"], message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise DialectError(f"messages[{position}].content must be a string or a list of blocks")
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_use" and role == "assistant":
            calls.append({"id": block.get("id"), "type": "function", "function": {
                "name": block.get("name"), "arguments": json.dumps(block.get("input") or {})}})
        elif kind == "tool_result" and role == "user":
            results.append({"role": "tool", "tool_call_id": block.get("tool_use_id"),
                            "content": _text_of(block.get("content") or "", f"messages[{position}] tool_result")})
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            continue
        elif kind in ("image", "document"):
            raise DialectError(f"messages[{position}]: {kind} blocks are not supported by this text-only endpoint")
        else:
            raise DialectError(f"messages[{position}]: unsupported content block {kind!r} for role {role}")
    if role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
        if calls:
            out["tool_calls"] = calls
        return [out]
    if not texts:
        return results
    # Several text blocks stay several parts (each arrives as sent); one is plain content.
    parts: str | list[dict[str, str]] = texts[0] if len(texts) == 1 else [{"type": "text", "text": t} for t in texts]
    return [*results, {"role": "user", "content": parts}]


def _text_of(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for block in value:
            if isinstance(block, dict) and block.get("type") == "text":
                parts.append(str(block.get("text", "")))
            elif isinstance(block, dict) and block.get("type") in ("image", "document"):
                raise DialectError(f"{where}: {block['type']} blocks are not supported by this text-only endpoint")
        return "".join(parts)
    raise DialectError(f"{where}: must be text or text blocks")


def _tool(tool: Any, position: int) -> dict[str, Any]:
    if not isinstance(tool, dict) or not tool.get("name"):
        raise DialectError(f"tools[{position}]: a tool needs a name")
    if tool.get("type") not in (None, "custom"):
        raise DialectError(f"tools[{position}]: server tool {tool.get('type')!r} is not supported")
    function = {"name": tool["name"], "parameters": tool.get("input_schema") or {"type": "object"}}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: Any) -> Any:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "auto":
        return "auto"
    if kind == "any":
        return "required"
    if kind == "none":
        return "none"
    if kind == "tool" and choice.get("name"):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise DialectError(f"unsupported tool_choice {choice!r}")


def _usage(usage: Any) -> dict[str, int]:
    prompt, completion = token_counts(usage)
    return {"input_tokens": prompt, "output_tokens": completion}


def response_from_chat(chat: dict[str, Any], model: str | None) -> dict[str, Any]:
    """The Messages response for a whole chat completion."""
    choice, message = first_choice(chat, "message")
    content: list[dict[str, Any]] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        content.append({"type": "tool_use", "id": call.get("id") or _id("toolu"), "name": function.get("name"),
                        "input": arguments_object(function.get("arguments"))})
    return {"id": _id("msg"), "type": "message", "role": "assistant", "model": chat.get("model") or model,
            "content": content, "stop_reason": _STOP.get(choice.get("finish_reason") or "stop", "end_turn"),
            "stop_sequence": None, "usage": _usage(chat.get("usage"))}


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return sse(data, event)


class AnthropicStream:
    """Chat-completion chunks in, Messages stream events (SSE bytes) out; one per streamed call."""

    def __init__(self, model: str | None) -> None:
        self._model = model
        self._started = False
        self._block: str | None = None  # "text" or "tool:<chat index>" of the open block
        self._index = -1
        self._stop: str | None = None
        self._usage: dict[str, int] = {"input_tokens": 0, "output_tokens": 0}
        self._finished = False

    def feed(self, chunk: dict[str, Any]) -> bytes:
        out = [self._start(chunk)] if not self._started else []
        if isinstance(chunk.get("usage"), dict):
            self._usage = _usage(chunk["usage"])
        choice, delta = first_choice(chunk, "delta")
        if delta.get("content"):
            if self._block != "text":
                out.append(self._open({"type": "text", "text": ""}, "text"))
            out.append(_sse("content_block_delta", {"type": "content_block_delta", "index": self._index,
                                                    "delta": {"type": "text_delta", "text": delta["content"]}}))
        for call in delta.get("tool_calls") or []:
            if not isinstance(call, dict):
                continue
            key = f"tool:{call.get('index', 0)}"
            function = call.get("function") or {}
            if self._block != key:
                block = {"type": "tool_use", "id": call.get("id") or _id("toolu"), "name": function.get("name"),
                         "input": {}}
                out.append(self._open(block, key))
            if function.get("arguments"):
                out.append(_sse("content_block_delta", {
                    "type": "content_block_delta", "index": self._index,
                    "delta": {"type": "input_json_delta", "partial_json": function["arguments"]}}))
        if choice.get("finish_reason"):
            self._stop = _STOP.get(choice["finish_reason"], "end_turn")
        return b"".join(out)

    def finish(self) -> bytes:
        """The closing events (idempotent: the second call returns nothing)."""
        if self._finished:
            return b""
        self._finished = True
        out = [self._start({})] if not self._started else []
        out.append(self._close())
        out.append(_sse("message_delta", {"type": "message_delta",
                                          "delta": {"stop_reason": self._stop or "end_turn", "stop_sequence": None},
                                          "usage": {"output_tokens": self._usage["output_tokens"]}}))
        out.append(_sse("message_stop", {"type": "message_stop"}))
        return b"".join(out)

    def _start(self, chunk: dict[str, Any]) -> bytes:
        self._started = True
        message = {"id": _id("msg"), "type": "message", "role": "assistant", "model": chunk.get("model") or self._model,
                   "content": [], "stop_reason": None, "stop_sequence": None, "usage": dict(self._usage)}
        return _sse("message_start", {"type": "message_start", "message": message})

    def _open(self, block: dict[str, Any], key: str) -> bytes:
        closing = self._close()
        self._index += 1
        self._block = key
        return closing + _sse("content_block_start", {"type": "content_block_start", "index": self._index,
                                                      "content_block": block})

    def _close(self) -> bytes:
        if self._block is None:
            return b""
        self._block = None
        return _sse("content_block_stop", {"type": "content_block_stop", "index": self._index})


# -- read-back: Messages answers as a chat completion -----------------------------------------------------------

_READ_STOP = {"end_turn": "stop", "stop_sequence": "stop", "pause_turn": "stop", "max_tokens": "length",
              "tool_use": "tool_calls", "refusal": "content_filter"}


def _read_usage(into: ChatBuilder, usage: Any) -> None:
    usage = as_dict(usage)
    if "input_tokens" in usage:
        into.prompt_tokens = as_count(usage["input_tokens"])
    if "output_tokens" in usage:
        into.completion_tokens = as_count(usage["output_tokens"])


def _read(body: Any) -> dict[str, Any]:
    body = as_dict(body)
    out = ChatBuilder()
    out.model = as_str(body.get("model")) or None
    for block in as_list(body.get("content")):
        block = as_dict(block)
        kind = block.get("type")
        if kind == "text":
            out.text.append(as_str(block.get("text")))
        elif kind == "thinking":
            out.reasoning.append(as_str(block.get("thinking")))
        elif kind == "tool_use":
            out.call(block.get("id"), block.get("name"), block.get("input"))
    out.finish = _READ_STOP.get(as_str(body.get("stop_reason")))
    _read_usage(out, body.get("usage"))
    return out.completion()


class _Recorder:
    def __init__(self) -> None:
        self._out = ChatBuilder()
        self._calls: dict[int, dict[str, Any]] = {}  # index -> the tool call entry its block feeds
        self._partial: dict[int, list[str]] = {}

    def feed(self, event: Any) -> None:
        event = as_dict(event)
        kind = event.get("type")
        if kind == "message_start":
            message = as_dict(event.get("message"))
            self._out.model = as_str(message.get("model")) or self._out.model
            _read_usage(self._out, message.get("usage"))
        elif kind == "content_block_start":
            self._start(event.get("index"), as_dict(event.get("content_block")))
        elif kind == "content_block_delta":
            self._delta(event.get("index"), as_dict(event.get("delta")))
        elif kind == "content_block_stop":
            self._stop(event.get("index"))
        elif kind == "message_delta":
            reason = as_str(as_dict(event.get("delta")).get("stop_reason"))
            self._out.finish = _READ_STOP.get(reason, self._out.finish)
            _read_usage(self._out, event.get("usage"))

    def _start(self, index: Any, block: dict[str, Any]) -> None:
        if not isinstance(index, int):
            return
        if block.get("type") == "text":
            self._out.text.append(as_str(block.get("text")))
        elif block.get("type") == "thinking":
            self._out.reasoning.append(as_str(block.get("thinking")))
        elif block.get("type") == "tool_use":
            start = block.get("input")
            self._calls[index] = self._out.call(block.get("id"), block.get("name"), start or {})
            self._partial[index] = []

    def _delta(self, index: Any, delta: dict[str, Any]) -> None:
        kind = delta.get("type")
        if kind == "text_delta":
            self._out.text.append(as_str(delta.get("text")))
        elif kind == "thinking_delta":
            self._out.reasoning.append(as_str(delta.get("thinking")))
        elif kind == "input_json_delta" and index in self._partial:
            self._partial[index].append(as_str(delta.get("partial_json")))

    def _stop(self, index: Any) -> None:
        if index in self._partial:
            self._finish_call(index)

    def _finish_call(self, index: int) -> None:
        parts = self._partial[index]
        if parts:
            self._calls[index]["function"]["arguments"] = "".join(parts)

    def completion(self) -> dict[str, Any]:
        for index in self._partial:
            self._finish_call(index)
        return self._out.completion()


class Anthropic(Dialect):
    """Anthropic Messages; see the module docstring."""

    name = "anthropic"
    paths = PATHS
    key_header = "x-api-key"
    passed_headers = {"anthropic-version": "2023-06-01", "anthropic-beta": None}
    resource = "/messages"
    token_cap_field = ("max_tokens",)
    last_events = frozenset({"message_stop"})

    response = staticmethod(response_from_chat)
    stream = staticmethod(AnthropicStream)
    recorder = staticmethod(_Recorder)
    read = staticmethod(_read)
    error_body = staticmethod(error_body)

    def to_chat(self, body: dict[str, Any], route: Route) -> dict[str, Any]:
        return to_chat(body)

    def stream_error(self, body: dict[str, Any]) -> bytes:
        return f"event: error\ndata: {json.dumps(body)}\n\n".encode()


DIALECT = Anthropic()
