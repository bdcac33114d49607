"""The OpenAI Responses API (`POST /v1/responses`) over an upstream that speaks chat completions: a pure
translation, request in -> chat request out, chat response (whole or streamed chunks) -> a Response object or
Responses stream events. No I/O; stateless (`store` and `previous_response_id` are refused: the agent must send
its whole conversation, as Codex does).

Requests: `instructions` become the system message; `input` (a string, or items) becomes messages: `message`
items (roles user, assistant, system, developer -> system; `input_text` / `output_text` / `text` parts, several
kept as several parts), `function_call` items become an assistant message's tool calls (consecutive ones merge
into one message, after the assistant text they follow), `function_call_output` items become `tool` messages,
`reasoning` items are dropped; `tools` of type `function` become chat functions (server tools such as
`web_search`, and tool namespaces, are left out; any other type is refused),
`tool_choice` maps (auto, required, none, a named function), `max_output_tokens` -> `max_tokens`, `temperature`,
`top_p`, `stream`. Images are refused. Ignored as harmless: `reasoning`, `include`, `prompt_cache_key`,
`parallel_tool_calls`, `store: false`, `metadata`, `text`, `service_tier`, `truncation`, `user`.

Responses: a `message` output item with one `output_text` part, then one `function_call` item per tool call;
`status` completed, or incomplete with `incomplete_details.reason` max_output_tokens at a length stop; usage maps
to input_tokens / output_tokens / total_tokens. Streams: `response.created`, `response.in_progress`, per item
`response.output_item.added`, (`response.content_part.added`, `response.output_text.delta`...,
`response.output_text.done`, `response.content_part.done`) or (`response.function_call_arguments.delta`...,
`response.function_call_arguments.done`), `response.output_item.done`, then `response.completed`, each with a
`sequence_number`; `finish()` closes a stream that ended without a finish reason.

Read-back (a call passed through to an upstream that speaks Responses): `message`, `function_call` and `reasoning`
output items; a stream by its final event (`response.completed`, `.incomplete` or `.failed`, which carries the
whole response), or, cut short, by the items so far; incomplete (max_output_tokens) -> length, content_filter ->
content_filter, else tool_calls when it called a function, else stop. Pass-through: `{base_url}/responses`, the
key as `Authorization: Bearer`, the cap on `max_output_tokens`.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from coding_agent_env.llm.dialects.base import Dialect, DialectError, Route, refuse_unknown
from coding_agent_env.llm.dialects.chat import (
    ChatBuilder,
    as_count,
    as_dict,
    as_list,
    as_str,
    first_choice,
    sse,
    token_counts,
)

__all__ = ["DIALECT", "PATHS", "DialectError", "ResponsesStream", "error_body", "response_from_chat", "to_chat"]

PATHS = frozenset({"/v1/responses", "/responses"})

_IGNORED = frozenset({"reasoning", "include", "prompt_cache_key", "parallel_tool_calls", "store", "metadata", "text",
                      "service_tier", "truncation", "user", "client_metadata"})
_KNOWN = frozenset({"model", "input", "instructions", "tools", "tool_choice", "max_output_tokens", "temperature",
                    "top_p", "stream"}) | _IGNORED
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
_LEFT_OUT_TOOLS = frozenset({"web_search", "web_search_preview", "namespace", "file_search", "code_interpreter",
                             "image_generation", "local_shell", "mcp"})


def error_body(status: int, message: str) -> dict[str, Any]:
    kinds = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found", 429: "rate_limit_exceeded"}
    return {"error": {"message": message, "type": kinds.get(status, "server_error"), "code": status, "param": None}}


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat-completions request for a Responses request; `DialectError` for what cannot be translated."""
    refuse_unknown(body, _KNOWN | {"previous_response_id"}, "Responses")
    if body.get("previous_response_id"):
        raise DialectError("previous_response_id is not supported: send the whole conversation as input")
    if body.get("store") is True:
        raise DialectError("store: true is not supported (this endpoint keeps no responses)")
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": str(body["instructions"])})
    raw = body.get("input")
    if isinstance(raw, str):
        messages.append({"role": "user", "content": raw})
    elif isinstance(raw, list):
        for position, item in enumerate(raw):
            _item(item, position, messages)
    else:
        raise DialectError("input must be a string or a list of items")
    out: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    for name in ("temperature", "top_p"):
        if body.get(name) is not None:
            out[name] = body[name]
    if body.get("stream") is True:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    tools = [_tool(tool, i) for i, tool in enumerate(body.get("tools") or []) if _offered(tool)]
    if tools:
        out["tools"] = tools
    if body.get("tool_choice") is not None:
        out["tool_choice"] = _tool_choice(body["tool_choice"])
    return out


def _item(item: Any, position: int, messages: list[dict[str, Any]]) -> None:
    kind = item.get("type", "message") if isinstance(item, dict) else None
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise DialectError(f"input[{position}]: role {role!r} is not supported")
        texts = _texts(item.get("content"), position)
        chat_role = "system" if role == "developer" else role
        if chat_role == "assistant":
            messages.append({"role": "assistant", "content": "".join(texts) or None})
        else:
            content: Any = texts[0] if len(texts) == 1 else [{"type": "text", "text": t} for t in texts]
            messages.append({"role": chat_role, "content": content if texts else ""})
    elif kind == "function_call":
        call = {"id": item.get("call_id") or item.get("id"), "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments") or ""}}
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output")
        text = output if isinstance(output, str) else "".join(_texts(output, position))
        messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
    elif kind == "reasoning":
        return
    else:
        raise DialectError(f"input[{position}]: item type {kind!r} is not supported")


def _texts(content: Any, position: int) -> list[str]:
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return []
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS:
            texts.append(str(part.get("text", "")))
        elif kind in ("input_image", "input_file", "input_audio"):
            raise DialectError(f"input[{position}]: {kind} parts are not supported by this text-only endpoint")
        else:
            raise DialectError(f"input[{position}]: content part {kind!r} is not supported")
    return texts


def _offered(tool: Any) -> bool:
    """Function tools are offered to the upstream; server tools (`web_search`, ...) and tool namespaces (a
    client's sub-agent kits) are left out: a chat-completions upstream can run neither."""
    return not (isinstance(tool, dict) and tool.get("type") in _LEFT_OUT_TOOLS)


def _tool(tool: Any, position: int) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type") != "function" or not tool.get("name"):
        kind = tool.get("type") if isinstance(tool, dict) else None
        raise DialectError(f"tools[{position}]: only function tools are supported (got {kind!r})")
    function = {"name": tool["name"], "parameters": tool.get("parameters") or {"type": "object"}}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "required", "none"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and choice.get("name"):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise DialectError(f"unsupported tool_choice {choice!r}")


def _usage(usage: Any) -> dict[str, Any]:
    prompt, completion = token_counts(usage)
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": prompt + completion}


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def _call_item(item_id: str, call_id: str, name: str | None, arguments: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def _response(response_id: str, model: str | None, output: list[dict[str, Any]], status: str, finish: str | None,
              usage: dict[str, Any] | None) -> dict[str, Any]:
    incomplete = {"reason": "max_output_tokens"} if finish == "length" else None
    return {"id": response_id, "object": "response", "created_at": int(time.time()), "model": model,
            "status": "incomplete" if incomplete and status == "completed" else status,
            "incomplete_details": incomplete, "error": None, "output": output, "usage": usage,
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}


def response_from_chat(chat: dict[str, Any], model: str | None) -> dict[str, Any]:
    """The Response object for a whole chat completion."""
    choice, message = first_choice(chat, "message")
    output: list[dict[str, Any]] = []
    if message.get("content"):
        output.append(_message_item(_id("msg"), message["content"]))
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        output.append(_call_item(_id("fc"), call.get("id") or _id("call"), function.get("name"),
                                 function.get("arguments") or ""))
    return _response(_id("resp"), chat.get("model") or model, output, "completed", choice.get("finish_reason"),
                     _usage(chat.get("usage")))


class ResponsesStream:
    """Chat-completion chunks in, Responses stream events (SSE bytes) out; one per streamed call."""

    def __init__(self, model: str | None) -> None:
        self._model = model
        self._id = _id("resp")
        self._sequence = 0
        self._started = False
        self._finished = False
        self._output: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None  # the item being streamed, with "key" (text or tool:<index>)
        self._finish: str | None = None
        self._usage: dict[str, Any] | None = None

    def feed(self, chunk: dict[str, Any]) -> bytes:
        out = [self._start()] if not self._started else []
        if isinstance(chunk.get("model"), str):
            self._model = chunk["model"]
        if isinstance(chunk.get("usage"), dict):
            self._usage = _usage(chunk["usage"])
        choice, delta = first_choice(chunk, "delta")
        if delta.get("content"):
            if self._open is None or self._open["key"] != "text":
                out.append(self._close())
                out.append(self._begin_text())
            self._open["text"] += delta["content"]
            out.append(self._event("response.output_text.delta", item_id=self._open["id"],
                                   output_index=self._open["index"], content_index=0, delta=delta["content"]))
        for call in delta.get("tool_calls") or []:
            if not isinstance(call, dict):
                continue
            key = f"tool:{call.get('index', 0)}"
            function = call.get("function") or {}
            if self._open is None or self._open["key"] != key:
                out.append(self._close())
                out.append(self._begin_call(key, call.get("id") or _id("call"), function.get("name")))
            if function.get("arguments"):
                self._open["arguments"] += function["arguments"]
                out.append(self._event("response.function_call_arguments.delta", item_id=self._open["id"],
                                       output_index=self._open["index"], delta=function["arguments"]))
        if choice.get("finish_reason"):
            self._finish = choice["finish_reason"]
        return b"".join(out)

    def finish(self) -> bytes:
        """The closing events (idempotent)."""
        if self._finished:
            return b""
        self._finished = True
        out = [self._start()] if not self._started else []
        out.append(self._close())
        response = _response(self._id, self._model, self._output, "completed", self._finish, self._usage or _usage({}))
        out.append(self._event("response.completed", response=response))
        return b"".join(out)

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return sse(data, kind)

    def _start(self) -> bytes:
        self._started = True
        skeleton = _response(self._id, self._model, [], "in_progress", None, None)
        return self._event("response.created", response=skeleton) + self._event("response.in_progress",
                                                                                  response=skeleton)

    def _begin_text(self) -> bytes:
        item_id = _id("msg")
        self._open = {"key": "text", "id": item_id, "index": len(self._output), "text": ""}
        added = self._event("response.output_item.added", output_index=self._open["index"],
                            item={**_message_item(item_id, "", "in_progress"), "content": []})
        part = self._event("response.content_part.added", item_id=item_id, output_index=self._open["index"],
                           content_index=0, part={"type": "output_text", "text": "", "annotations": []})
        return added + part

    def _begin_call(self, key: str, call_id: str, name: str | None) -> bytes:
        item_id = _id("fc")
        self._open = {"key": key, "id": item_id, "index": len(self._output), "call_id": call_id, "name": name,
                      "arguments": ""}
        return self._event("response.output_item.added", output_index=self._open["index"],
                           item=_call_item(item_id, call_id, name, "", "in_progress"))

    def _close(self) -> bytes:
        item, self._open = self._open, None
        if item is None:
            return b""
        if item["key"] == "text":
            done = _message_item(item["id"], item["text"])
            events = (self._event("response.output_text.done", item_id=item["id"], output_index=item["index"],
                                  content_index=0, text=item["text"])
                      + self._event("response.content_part.done", item_id=item["id"], output_index=item["index"],
                                    content_index=0, part=done["content"][0]))
        else:
            done = _call_item(item["id"], item["call_id"], item["name"], item["arguments"])
            events = self._event("response.function_call_arguments.done", item_id=item["id"],
                                 output_index=item["index"], arguments=item["arguments"])
        self._output.append(done)
        return events + self._event("response.output_item.done", output_index=item["index"], item=done)


# -- read-back: Responses answers as a chat completion ----------------------------------------------------------

_FINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})


def _read(body: Any) -> dict[str, Any]:
    body = as_dict(body)
    out = ChatBuilder()
    out.model = as_str(body.get("model")) or None
    for item in as_list(body.get("output")):
        _read_item(out, as_dict(item))
    reason = as_str(as_dict(body.get("incomplete_details")).get("reason"))
    if body.get("status") == "incomplete":
        out.finish = "content_filter" if reason == "content_filter" else "length"
    usage = as_dict(body.get("usage"))
    out.prompt_tokens, out.completion_tokens = as_count(usage.get("input_tokens")), as_count(usage.get("output_tokens"))
    return out.completion()


def _read_item(out: ChatBuilder, item: dict[str, Any]) -> None:
    kind = item.get("type")
    if kind == "message":
        for part in as_list(item.get("content")):
            part = as_dict(part)
            if part.get("type") in ("output_text", "text"):
                out.text.append(as_str(part.get("text")))
    elif kind == "function_call":
        out.call(item.get("call_id") or item.get("id"), item.get("name"), item.get("arguments") or "")
    elif kind == "reasoning":
        for part in as_list(item.get("summary")) + as_list(item.get("content")):
            out.reasoning.append(as_str(as_dict(part).get("text")))


class _Recorder:
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
        event = as_dict(event)
        kind = event.get("type")
        response = as_dict(event.get("response"))
        if kind in _FINAL_EVENTS:
            self._final = response
        elif kind in ("response.output_item.added", "response.output_item.done"):
            item = as_dict(event.get("item"))
            self._items[item.get("id") or event.get("output_index")] = {**item, "done": kind.endswith("done")}
        elif kind in self._DELTAS:
            item = self._items.setdefault(event.get("item_id"), {"type": "message", "done": False})
            if not item["done"]:
                key = self._DELTAS[kind]
                item[key] = as_str(item.get(key)) + as_str(event.get("delta"))
        if response.get("model"):
            self._model = as_str(response["model"])

    def completion(self) -> dict[str, Any]:
        final = dict(self._final or {"model": self._model})
        if not as_list(final.get("output")):
            final["output"] = [self._as_done(item) for item in self._items.values()]
        return _read(final)

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


class Responses(Dialect):
    """The OpenAI Responses API; see the module docstring."""

    name = "responses"
    paths = PATHS
    resource = "/responses"
    token_cap_field = ("max_output_tokens",)
    last_events = _FINAL_EVENTS

    response = staticmethod(response_from_chat)
    stream = staticmethod(ResponsesStream)
    recorder = staticmethod(_Recorder)
    read = staticmethod(_read)
    error_body = staticmethod(error_body)

    def to_chat(self, body: dict[str, Any], route: Route) -> dict[str, Any]:
        return to_chat(body)

    def stream_error(self, body: dict[str, Any]) -> bytes:
        return f"event: error\ndata: {json.dumps({'type': 'error', **body['error']})}\n\n".encode()


DIALECT = Responses()
