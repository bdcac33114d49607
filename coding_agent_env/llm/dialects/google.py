"""Google `generateContent` / `streamGenerateContent` (`POST /v1beta/models/{model}:generateContent`, `?alt=sse`
for the stream) over an upstream that speaks chat completions: a pure translation. No I/O.

Requests: `systemInstruction` becomes the system message; `contents` turns (role user / model) become messages:
`text` parts (several kept as several parts for a user), `functionCall` parts an assistant's tool calls (the id is
the part's `id` when it has one, else derived from the position), `functionResponse` parts `tool` messages (matched
to the earlier call by `id`, else by name, most recent unanswered first), `thought` parts dropped; `tools`'
`functionDeclarations` become chat functions (`parameters` or `parametersJsonSchema`); `toolConfig` maps (AUTO,
ANY -> required, or one allowed name, NONE); `generationConfig` maps `maxOutputTokens`, `temperature`, `topP`,
`stopSequences` (`thinkingConfig`, `candidateCount` 1 and the rest are ignored). `inlineData` / `fileData` parts
are refused. The model comes from the URL.

Responses: one candidate with `text` and `functionCall` parts (arguments parsed as JSON; not a JSON object:
`{"arguments": <the raw string>}`), `finishReason` STOP (also for tool calls), MAX_TOKENS, SAFETY; usage as
`usageMetadata`. Streams (`alt=sse`, `data:` lines only): text as it comes, each function call whole once its
arguments are complete, and a last chunk with the finish reason and usage.

Read-back (a call passed through to an upstream that speaks generateContent): each streamed chunk is a
GenerateContentResponse (a whole answer is one chunk; a stream without `alt=sse` comes as a JSON array of them);
candidate 0's `text` parts (`thought` ones as reasoning) and `functionCall`s; MAX_TOKENS -> length, SAFETY /
RECITATION / BLOCKLIST / PROHIBITED_CONTENT / SPII / IMAGE_SAFETY -> content_filter, else tool_calls when it called
one, else stop; a stream ends with the chunk that has a `finishReason`. Pass-through:
`{base_url}/models/MODEL:METHOD` (the upstream's model, else the path's; `alt` kept), the key as
`x-goog-api-key`, the cap on `generationConfig.maxOutputTokens`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from coding_agent_env.llm.dialects.base import Dialect, DialectError, Route, refuse_unknown
from coding_agent_env.llm.dialects.chat import ChatBuilder, arguments_object, first_choice, sse, token_counts
from coding_agent_env.llm.dialects.chat import as_count, as_dict, as_list, as_str

__all__ = ["DIALECT", "DialectError", "GoogleStream", "error_body", "parse_path", "response_from_chat", "to_chat"]

_PATH = re.compile(r"^/(?:v1beta|v1)/models/(?P<model>.+?):(?P<method>generateContent|streamGenerateContent)$")
_FINISH = {"stop": "STOP", "length": "MAX_TOKENS", "tool_calls": "STOP", "content_filter": "SAFETY"}
_KNOWN = frozenset({"contents", "systemInstruction", "tools", "toolConfig", "generationConfig", "safetySettings",
                    "cachedContent", "labels"})


def parse_path(path: str) -> tuple[str, bool] | None:
    """(model, streamed) for a generateContent path, else None."""
    match = _PATH.match(path)
    if match is None:
        return None
    return match["model"], match["method"] == "streamGenerateContent"


def error_body(status: int, message: str) -> dict[str, Any]:
    states = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
              429: "RESOURCE_EXHAUSTED"}
    return {"error": {"code": status, "message": message, "status": states.get(status, "INTERNAL")}}


def to_chat(body: dict[str, Any], model: str, stream: bool) -> dict[str, Any]:
    """The chat-completions request for a generateContent request; `DialectError` for what cannot be translated."""
    refuse_unknown(body, _KNOWN, "generateContent")
    messages: list[dict[str, Any]] = []
    system = body.get("systemInstruction")
    if system:
        texts = _texts(system.get("parts") if isinstance(system, dict) else system, "systemInstruction")
        messages.append({"role": "system", "content": "".join(texts)})
    contents = body.get("contents")
    if not isinstance(contents, list):
        raise DialectError("contents must be a list")
    pending: list[tuple[str | None, str]] = []  # (name, call id) of calls not yet answered
    for position, content in enumerate(contents):
        if not isinstance(content, dict):
            raise DialectError(f"contents[{position}] must be an object")
        role = content.get("role") or "user"
        parts = content.get("parts") if isinstance(content.get("parts"), list) else []
        if role == "model":
            messages.append(_model_turn(parts, position, pending))
        elif role in ("user", "function"):
            messages.extend(_user_turn(parts, position, pending))
        else:
            raise DialectError(f"contents[{position}]: role {role!r} is not supported")
    out: dict[str, Any] = {"model": model, "messages": messages}
    config = body.get("generationConfig") if isinstance(body.get("generationConfig"), dict) else {}
    for ours, theirs in (("max_tokens", "maxOutputTokens"), ("temperature", "temperature"), ("top_p", "topP")):
        if config.get(theirs) is not None:
            out[ours] = config[theirs]
    if config.get("stopSequences"):
        out["stop"] = list(config["stopSequences"])
    if stream:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    functions = [f for tool in body.get("tools") or [] if isinstance(tool, dict)
                 for f in tool.get("functionDeclarations") or []]
    if functions:
        out["tools"] = [_function(f, i) for i, f in enumerate(functions)]
    choice = _tool_choice(body.get("toolConfig"))
    if choice is not None:
        out["tool_choice"] = choice
    return out


def _texts(parts: Any, where: str) -> list[str]:
    if isinstance(parts, str):
        return [parts]
    texts = []
    for part in parts if isinstance(parts, list) else []:
        if isinstance(part, dict) and "text" in part and not part.get("thought"):
            texts.append(str(part["text"]))
    return texts


def _model_turn(parts: list[Any], position: int, pending: list[tuple[str | None, str]]) -> dict[str, Any]:
    texts, calls = [], []
    for index, part in enumerate(parts):
        if not isinstance(part, dict) or part.get("thought"):
            continue
        if "text" in part:
            texts.append(str(part["text"]))
        elif "functionCall" in part:
            call = part["functionCall"] if isinstance(part["functionCall"], dict) else {}
            call_id = str(call.get("id") or f"call_{position}_{index}")
            pending.append((call.get("name"), call_id))
            calls.append({"id": call_id, "type": "function",
                          "function": {"name": call.get("name"), "arguments": json.dumps(call.get("args") or {})}})
        elif "inlineData" in part or "fileData" in part:
            raise DialectError(f"contents[{position}]: media parts are not supported by this text-only endpoint")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _user_turn(parts: list[Any], position: int, pending: list[tuple[str | None, str]]) -> list[dict[str, Any]]:
    out, texts = [], []
    for part in parts:
        if not isinstance(part, dict):
            continue
        if "text" in part and not part.get("thought"):
            texts.append(str(part["text"]))
        elif "functionResponse" in part:
            answer = part["functionResponse"] if isinstance(part["functionResponse"], dict) else {}
            call_id = _answered(pending, answer.get("id"), answer.get("name"))
            response = answer.get("response")
            text = response if isinstance(response, str) else json.dumps(response)
            out.append({"role": "tool", "tool_call_id": call_id, "content": text})
        elif "inlineData" in part or "fileData" in part:
            raise DialectError(f"contents[{position}]: media parts are not supported by this text-only endpoint")
    if texts:
        content: Any = texts[0] if len(texts) == 1 else [{"type": "text", "text": t} for t in texts]
        out.append({"role": "user", "content": content})
    return out


def _answered(pending: list[tuple[str | None, str]], call_id: Any, name: Any) -> str:
    for i in range(len(pending) - 1, -1, -1):
        if (call_id and pending[i][1] == call_id) or (not call_id and pending[i][0] == name):
            return pending.pop(i)[1]
    return str(call_id or f"call_{name}")


def _function(declaration: Any, position: int) -> dict[str, Any]:
    if not isinstance(declaration, dict) or not declaration.get("name"):
        raise DialectError(f"functionDeclarations[{position}]: a function needs a name")
    parameters = declaration.get("parametersJsonSchema") or declaration.get("parameters") or {"type": "object"}
    function = {"name": declaration["name"], "parameters": _lower_types(parameters)}
    if declaration.get("description"):
        function["description"] = declaration["description"]
    return {"type": "function", "function": function}


def _lower_types(schema: Any) -> Any:
    """Google's OpenAPI-style schemas spell types in capitals (`OBJECT`); JSON Schema wants lower case."""
    if isinstance(schema, dict):
        return {k: (v.lower() if k == "type" and isinstance(v, str) else _lower_types(v)) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_lower_types(v) for v in schema]
    return schema


def _tool_choice(config: Any) -> Any:
    calling = config.get("functionCallingConfig") if isinstance(config, dict) else None
    if not isinstance(calling, dict) or not calling.get("mode"):
        return None
    mode = str(calling["mode"]).upper()
    if mode == "AUTO":
        return "auto"
    if mode == "NONE":
        return "none"
    if mode == "ANY":
        names = calling.get("allowedFunctionNames") or []
        return {"type": "function", "function": {"name": names[0]}} if len(names) == 1 else "required"
    raise DialectError(f"unsupported functionCallingConfig mode {calling['mode']!r}")


def _usage(usage: Any) -> dict[str, int]:
    prompt, completion = token_counts(usage)
    return {"promptTokenCount": prompt, "candidatesTokenCount": completion, "totalTokenCount": prompt + completion}


def _call_part(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    call: dict[str, Any] = {"name": name, "args": arguments_object(arguments)}
    if call_id:
        call["id"] = call_id
    return {"functionCall": call}


def response_from_chat(chat: dict[str, Any], model: str | None) -> dict[str, Any]:
    """The GenerateContentResponse for a whole chat completion."""
    choice, message = first_choice(chat, "message")
    parts: list[dict[str, Any]] = []
    if message.get("content"):
        parts.append({"text": message["content"]})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        parts.append(_call_part(call.get("id"), function.get("name"), function.get("arguments")))
    candidate = {"content": {"role": "model", "parts": parts}, "index": 0,
                 "finishReason": _FINISH.get(choice.get("finish_reason") or "stop", "STOP")}
    return {"candidates": [candidate], "usageMetadata": _usage(chat.get("usage")),
            "modelVersion": chat.get("model") or model}


class GoogleStream:
    """Chat-completion chunks in, `streamGenerateContent?alt=sse` chunks (SSE bytes) out; one per streamed call."""

    def __init__(self, model: str | None) -> None:
        self._model = model
        self._calls: dict[int, dict[str, Any]] = {}
        self._finish: str | None = None
        self._usage: dict[str, int] | None = None
        self._finished = False

    def feed(self, chunk: dict[str, Any]) -> bytes:
        if isinstance(chunk.get("usage"), dict):
            self._usage = _usage(chunk["usage"])
        choice, delta = first_choice(chunk, "delta")
        out = b""
        if delta.get("content"):
            out += self._chunk([{"text": delta["content"]}])
        for call in delta.get("tool_calls") or []:
            if not isinstance(call, dict):
                continue
            entry = self._calls.setdefault(int(call.get("index", 0)), {"id": None, "name": None, "arguments": ""})
            function = call.get("function") or {}
            entry["id"] = entry["id"] or call.get("id")
            entry["name"] = entry["name"] or function.get("name")
            entry["arguments"] += function.get("arguments") or ""
        if choice.get("finish_reason"):
            self._finish = choice["finish_reason"]
        return out

    def finish(self) -> bytes:
        """The function calls (whole) and the last chunk with the finish reason and usage (idempotent)."""
        if self._finished:
            return b""
        self._finished = True
        parts = [_call_part(c["id"], c["name"], c["arguments"]) for _, c in sorted(self._calls.items())]
        return self._chunk(parts, finish=_FINISH.get(self._finish or "stop", "STOP"))

    def _chunk(self, parts: list[dict[str, Any]], finish: str | None = None) -> bytes:
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
        body: dict[str, Any] = {"candidates": [candidate], "modelVersion": self._model}
        if finish is not None:
            candidate["finishReason"] = finish
            body["usageMetadata"] = self._usage or _usage({})
        return sse(body)


# -- read-back: generateContent answers as a chat completion ----------------------------------------------------

_FILTERED = frozenset({"SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY"})


class _Recorder:
    """Each chunk of a stream is a GenerateContentResponse; a whole response is one chunk."""

    def __init__(self) -> None:
        self._out = ChatBuilder()
        self._reason: str | None = None

    def feed(self, event: Any) -> None:
        event = as_dict(event)
        self._out.model = as_str(event.get("modelVersion")) or self._out.model
        candidates = as_list(event.get("candidates"))
        candidate = as_dict(candidates[0]) if candidates else {}
        for part in as_list(as_dict(candidate.get("content")).get("parts")):
            part = as_dict(part)
            call = part.get("functionCall")
            if isinstance(call, dict):
                self._out.call(call.get("id"), call.get("name"), call.get("args"))
            elif isinstance(part.get("text"), str):
                (self._out.reasoning if part.get("thought") is True else self._out.text).append(part["text"])
        if candidate.get("finishReason"):
            self._reason = as_str(candidate["finishReason"])
        usage = as_dict(event.get("usageMetadata"))
        if usage:
            self._out.prompt_tokens = as_count(usage.get("promptTokenCount"))
            self._out.completion_tokens = as_count(usage.get("candidatesTokenCount"))

    def completion(self) -> dict[str, Any]:
        if self._reason == "MAX_TOKENS":
            self._out.finish = "length"
        elif self._reason in _FILTERED:
            self._out.finish = "content_filter"
        return self._out.completion()


class Google(Dialect):
    """Google generateContent; see the module docstring."""

    name = "google"
    key_header = "x-goog-api-key"
    model_field = None  # the model travels in the URL
    token_cap_field = ("generationConfig", "maxOutputTokens")

    response = staticmethod(response_from_chat)
    stream = staticmethod(GoogleStream)
    recorder = staticmethod(_Recorder)
    error_body = staticmethod(error_body)

    def match(self, path: str) -> Route | None:
        found = parse_path(path)
        return None if found is None else Route(self, model=found[0], streamed=found[1])

    def to_chat(self, body: dict[str, Any], route: Route) -> dict[str, Any]:
        assert route.model is not None and route.streamed is not None, route
        return to_chat(body, route.model, route.streamed)

    def ends(self, event: dict[str, Any]) -> bool:
        """A stream's last chunk is the one with a finishReason."""
        candidates = event.get("candidates")
        return isinstance(candidates, list) and any(isinstance(c, dict) and c.get("finishReason") for c in candidates)

    def stream_error(self, body: dict[str, Any]) -> bytes:
        return f"data: {json.dumps(body)}\n\n".encode()

    def upstream_path(self, route: Route, model: str | None, query: Mapping[str, str]) -> str:
        method = "streamGenerateContent" if route.streamed else "generateContent"
        path = f"/models/{quote(model or '', safe='/-_.')}:{method}"
        return path + f"?alt={quote(query['alt'])}" if query.get("alt") else path


DIALECT = Google()
