"""Assemble a `Turn` from what the upstream returned, streamed or not.

`TurnAssembler` is total: any JSON value may be fed to it and it never raises; fields it cannot find stay
empty. Streamed chunks and a whole response produce the same message, finish reason, usage, token ids,
logprobs and token strings (each logprob's `token`, aligned with the logprobs). Only choice 0 is recorded
(agents ask for one). Where the token ids are depends on the engine (`llm.engines`): its adapter reads them; with
`detect_for` (the upstream's base URL) an engine not known yet is learnt from the answer itself.
"""

from __future__ import annotations

from typing import Any

from coding_agent_env.llm.engines import GENERIC, Engine, detect
from coding_agent_env.models import ToolCall, TurnMessage, Usage

__all__ = ["TurnAssembler"]


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _ints(value: Any) -> list[int] | None:
    """Token ids as given, or None when any entry is not a non-negative integer (garbage is never trained on)."""
    ids = _list(value)
    if all(type(v) is int and v >= 0 for v in ids):
        return ids
    return None


class _ToolCallParts:
    def __init__(self) -> None:
        self.id: str | None = None
        self.name: str | None = None
        self.arguments: list[str] = []

    def add(self, delta: dict[str, Any]) -> None:
        self.id = self.id or _str(delta.get("id"))
        function = _dict(delta.get("function"))
        self.name = self.name or _str(function.get("name"))
        arguments = _str(function.get("arguments"))
        if arguments:
            self.arguments.append(arguments)

    def build(self) -> ToolCall:
        return ToolCall(id=self.id, name=self.name, arguments="".join(self.arguments))


class TurnAssembler:
    """Accumulates one call's response: `add_chunk` per streamed chunk, or `add_response` once."""

    def __init__(self, engine: Engine = GENERIC, detect_for: str | None = None) -> None:
        self.engine = engine
        self._detect_for = detect_for if engine is GENERIC else None
        self.model: str | None = None
        self.finish_reason: str | None = None
        self.usage: Usage | None = None
        self.prompt_token_ids: list[int] | None = None
        self.completion_token_ids: list[int] | None = None
        self.logprobs: list[float] | None = None
        self.tokens: list[str] | None = None
        self.policy_version: Any = None
        """The weight version the engine wrote in its answer (`Engine.policy_version`), unchecked."""
        self._bad_ids = False
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._tools: dict[int, _ToolCallParts] = {}

    def add_chunk(self, chunk: Any) -> None:
        """One `chat.completion.chunk` (its parsed JSON). Written for speed: it runs on every streamed chunk."""
        if type(chunk) is not dict:
            return
        if self._detect_for is not None:
            self._detect(chunk)
        if "usage" in chunk:
            self._common(chunk)
        if "metadata" in chunk:  # where engines put a weight version; absent from ordinary chunks
            self._version(chunk)
        model = chunk.get("model")
        if model is not None and model != self.model and isinstance(model, str):
            self.model = model
        choices = chunk.get("choices")
        if not choices or type(choices) is not list:
            if "prompt_token_ids" in chunk:
                self._ids(chunk, {})
            return
        choice = choices[0]
        if type(choice) is not dict or choice.get("index", 0) != 0:
            choice = self._choice(chunk)
            if choice is None:
                return
        delta = choice.get("delta")
        if type(delta) is dict:
            content = delta.get("content")
            if content and type(content) is str:
                self._content.append(content)
            if "reasoning_content" in delta or "reasoning" in delta:
                self._text({"reasoning_content": delta.get("reasoning_content"), "reasoning": delta.get("reasoning")})
            if delta.get("tool_calls"):
                self._tool_deltas(delta["tool_calls"])
        if (choice.get("finish_reason") or choice.get("token_ids") is not None or choice.get("logprobs")
                or "prompt_token_ids" in chunk):
            self._choice_extras(choice)
            self._ids(chunk, choice)

    def _tool_deltas(self, calls: Any) -> None:
        for position, call in enumerate(_list(calls)):
            call = _dict(call)
            index = call.get("index")
            index = index if isinstance(index, int) else position
            self._tools.setdefault(index, _ToolCallParts()).add(call)

    def add_response(self, response: Any) -> None:
        """A whole `chat.completion` (its parsed JSON)."""
        response = _dict(response)
        if self._detect_for is not None:
            self._detect(response)
        self._common(response)
        self._version(response)
        choice = self._choice(response)
        if choice is None:
            self._ids(response, {})
            return
        message = _dict(choice.get("message"))
        self._text(message)
        for index, call in enumerate(_list(message.get("tool_calls"))):
            self._tools.setdefault(index, _ToolCallParts()).add(_dict(call))
        self._choice_extras(choice)
        self._ids(response, choice)

    def sampled_ids(self) -> list[int]:
        """The sampled token ids: where the engine put them (vLLM's `token_ids`, llama.cpp's logprob `id`s,
        SGLang's `meta_info`), else those spelled in its logprob tokens as `token_id:N` (vLLM's
        `--return-tokens-as-token-ids`), else none."""
        if self._bad_ids:
            return []
        if self.completion_token_ids is not None:
            return self.completion_token_ids
        tokens = self.tokens or []
        if tokens and all(t.startswith("token_id:") and t[9:].isdigit() for t in tokens):
            return [int(t[9:]) for t in tokens]
        return []

    def message(self) -> TurnMessage:
        content = "".join(self._content) if self._content else None
        reasoning = "".join(self._reasoning) if self._reasoning else None
        tools = [self._tools[index].build() for index in sorted(self._tools)]
        return TurnMessage(content=content, reasoning_content=reasoning, tool_calls=tools)

    # -- pieces ------------------------------------------------------------------------------------------

    def _common(self, obj: dict[str, Any]) -> None:
        self.model = _str(obj.get("model")) or self.model
        if "usage" in obj and isinstance(obj["usage"], dict):
            usage = obj["usage"]
            self.usage = Usage(**{k: v for k in Usage.model_fields if isinstance(v := usage.get(k), int)})

    def _version(self, obj: dict[str, Any]) -> None:
        version = self.engine.policy_version(obj)
        if version is not None:
            self.policy_version = version

    def _detect(self, obj: dict[str, Any]) -> None:
        assert self._detect_for is not None
        found = detect(self._detect_for, obj)
        if found is not None:
            self.engine = found
            self._detect_for = None

    def _ids(self, obj: dict[str, Any], choice: dict[str, Any]) -> None:
        """The ids the engine put in this answer or chunk."""
        found = self.engine.ids(obj, choice)
        if found.prompt is not None:
            self.prompt_token_ids = _ints(found.prompt)
            self._bad_ids = self._bad_ids or self.prompt_token_ids is None
        if found.completion is not None:
            if self.completion_token_ids is None:
                self.completion_token_ids = []
            ids = _ints(found.completion)
            if ids is None:
                self._bad_ids = True
            else:
                self.completion_token_ids.extend(ids)

    @staticmethod
    def _choice(obj: dict[str, Any]) -> dict[str, Any] | None:
        for choice in _list(obj.get("choices")):
            choice = _dict(choice)
            if choice.get("index", 0) == 0:
                return choice
        return None

    def _text(self, part: dict[str, Any]) -> None:
        content = _str(part.get("content"))
        if content:
            self._content.append(content)
        reasoning = _str(part.get("reasoning_content")) or _str(part.get("reasoning"))
        if reasoning:
            self._reasoning.append(reasoning)

    def _choice_extras(self, choice: dict[str, Any]) -> None:
        self.finish_reason = _str(choice.get("finish_reason")) or self.finish_reason
        entries = _list(_dict(choice.get("logprobs")).get("content"))
        if entries:
            if self.logprobs is None:
                self.logprobs = []
            if self.tokens is None:
                self.tokens = []
            for entry in entries:
                if isinstance(entry, dict) and _is_number(entry.get("logprob")):
                    self.logprobs.append(float(entry["logprob"]))
                    token = entry.get("token")
                    self.tokens.append(token if isinstance(token, str) else "")
