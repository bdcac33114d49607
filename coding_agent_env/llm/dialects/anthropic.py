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
"""

from __future__ import annotations

import json
import uuid
from typing import Any

__all__ = ["PATHS", "AnthropicStream", "DialectError", "error_body", "response_from_chat", "to_chat"]

PATHS = frozenset({"/v1/messages", "/messages"})

_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use"}
_IGNORED = frozenset({"metadata", "thinking", "top_k", "service_tier", "container", "mcp_servers", "context_management",
                      "output_config", "betas", "cache_control"})
_KNOWN = frozenset({"model", "messages", "system", "max_tokens", "temperature", "top_p", "stop_sequences",
                    "stream", "tools", "tool_choice"}) | _IGNORED


class DialectError(ValueError):
    """A request that cannot be translated; the message says which field and why."""


def error_body(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error shape (which its clients turn into typed errors)."""
    kinds = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
             413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error"}
    return {"type": "error", "error": {"type": kinds.get(status, "api_error"), "message": message}}


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat-completions request for a Messages request; `DialectError` for what cannot be translated."""
    unknown = sorted(set(body) - _KNOWN)
    if unknown:
        raise DialectError(f"unsupported Messages field(s): {', '.join(unknown)}")
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


def _input(arguments: Any) -> dict[str, Any]:
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) and arguments else {}
    except ValueError:
        return {"arguments": arguments}
    return parsed if isinstance(parsed, dict) else {"arguments": arguments}


def _usage(usage: Any) -> dict[str, int]:
    usage = usage if isinstance(usage, dict) else {}
    return {"input_tokens": int(usage.get("prompt_tokens") or 0), "output_tokens": int(usage.get("completion_tokens") or 0)}


def response_from_chat(chat: dict[str, Any], model: str | None) -> dict[str, Any]:
    """The Messages response for a whole chat completion."""
    choices = chat.get("choices") if isinstance(chat.get("choices"), list) else []
    choice = choices[0] if choices and isinstance(choices[0], dict) else {}
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    content: list[dict[str, Any]] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        content.append({"type": "tool_use", "id": call.get("id") or _id("toolu"), "name": function.get("name"),
                        "input": _input(function.get("arguments"))})
    return {"id": _id("msg"), "type": "message", "role": "assistant", "model": chat.get("model") or model,
            "content": content, "stop_reason": _STOP.get(choice.get("finish_reason") or "stop", "end_turn"),
            "stop_sequence": None, "usage": _usage(chat.get("usage"))}


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


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
        choices = chunk.get("choices") if isinstance(chunk.get("choices"), list) else []
        choice = choices[0] if choices and isinstance(choices[0], dict) else {}
        delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
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
