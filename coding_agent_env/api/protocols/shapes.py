"""OpenEnv wire shapes (PROTOCOL.md §2-§4), as strict pydantic models and small serializers.

Only shapes live here; behaviour is in ws.py, jsonrpc.py and http.py. Every inbound envelope forbids extra
keys, as OpenEnv's do, so `{"type":"state","data":{}}` is a validation error. The `state` model is
`env_state.EnvState` (the client reads the same one). `dumps` is the one encoder of what goes out: a tool's
result (`tools.Serialised`) is written as the JSON text it was serialised to once, never encoded again.
"""

from __future__ import annotations

import json
import secrets
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from coding_agent_env.api.tools import Serialised, ToolReply

__all__ = [
    "CallToolAction",
    "CallToolObservation",
    "JsonRpcRequest",
    "ListToolsAction",
    "ListToolsObservation",
    "ToolErrorInfo",
    "ToolErrorType",
    "WS_ENVELOPES",
    "call_tool_payload",
    "dumps",
    "loads_bounded",
    "observation_payload",
    "rpc_error",
    "rpc_result",
    "tool_result",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ListToolsAction(_Strict):
    """`{"type":"list_tools"}`: list the environment's tools."""

    type: Literal["list_tools"] = "list_tools"
    metadata: dict[str, Any] = Field(default_factory=dict)


class CallToolAction(_Strict):
    """`{"type":"call_tool","tool_name":...,"arguments":{...}}`: call one tool."""

    type: Literal["call_tool"] = "call_tool"
    tool_name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)


ToolErrorType = Literal["execution_error", "invalid_args", "transport_error", "tool_not_found", "timeout"]


class ToolErrorInfo(_Strict):
    """A tool failure on the step path: exactly these two keys (OpenEnv clients reject any other)."""

    error_type: ToolErrorType
    message: str


class _Observation(_Strict):
    done: bool = False
    reward: bool | int | float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class CallToolObservation(_Observation):
    tool_name: str
    result: Any = None
    error: ToolErrorInfo | None = None


class ListToolsObservation(_Observation):
    tools: list[dict[str, Any]] = Field(default_factory=list)


class _ResetMessage(_Strict):
    type: Literal["reset"]
    data: dict[str, Any] = Field(default_factory=dict)


class _StepMessage(_Strict):
    type: Literal["step"]
    data: dict[str, Any]


class _StateMessage(_Strict):
    type: Literal["state"]


class _CloseMessage(_Strict):
    type: Literal["close"]


class _McpMessage(_Strict):
    type: Literal["mcp"]
    data: Any


WS_ENVELOPES: dict[str, type[_Strict]] = {
    "reset": _ResetMessage,
    "step": _StepMessage,
    "state": _StateMessage,
    "close": _CloseMessage,
    "mcp": _McpMessage,
}
"""Client -> server envelope models by `type`."""


class JsonRpcRequest(_Strict):
    """One JSON-RPC 2.0 request; `params` must be an object."""

    jsonrpc: Literal["2.0"]
    method: str
    params: dict[str, Any] = Field(default_factory=dict)
    id: str | int | None = None


def loads_bounded(text: str | bytes, max_depth: int) -> Any:
    """Parse JSON, refusing nesting deeper than `max_depth`. ValueError (with a one-line reason) on failure.

    Never raises RecursionError: the C parser's own recursion guard is turned into a ValueError, and the
    depth check walks the parsed value iteratively."""
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        reason = "nesting too deep" if isinstance(exc, RecursionError) else str(exc)
        raise ValueError(reason) from None
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, dict | list):
                if depth + 1 > max_depth:
                    raise ValueError(f"nesting deeper than {max_depth} levels")
                stack.append((child, depth + 1))
    return value


def observation_payload(observation: _Observation) -> dict[str, Any]:
    """`{"observation":{...},"reward":...,"done":...}`, plus top-level `metadata` only when non-empty."""
    body = observation.model_dump(mode="json", exclude={"reward", "done", "metadata"})
    payload: dict[str, Any] = {"observation": body, "reward": observation.reward, "done": observation.done}
    if observation.metadata:
        payload["metadata"] = observation.metadata
    return payload


def rpc_result(request_id: Any, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def rpc_error(request_id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message, "data": data}}


def tool_result(reply: ToolReply) -> dict[str, Any]:
    """OpenEnv's tool-result dict (step path and JSON-RPC): clients read `data`; `content[0].text` is the
    reply's text (a result's JSON, or what a terminal call says)."""
    return {
        "content": [{"type": "text", "text": reply.text, "annotations": None, "meta": None}],
        "structured_content": reply.data,
        "meta": None,
        "data": reply.data,
        "is_error": False,
    }


def call_tool_payload(
    tool_name: str, reply: ToolReply | None = None, error: ToolErrorInfo | None = None
) -> dict[str, Any]:
    """A `call_tool` step's payload: the reply as OpenEnv's tool-result dict (with its reward and done), or the
    error. The result goes in as it is (already serialised), not through the observation model."""
    if reply is None:
        return observation_payload(CallToolObservation(tool_name=tool_name, error=error))
    observation = CallToolObservation(tool_name=tool_name, reward=reply.reward, done=reply.done)
    payload = observation_payload(observation)
    payload["observation"]["result"] = tool_result(reply)
    return payload


def dumps(value: Any) -> str:
    """`json.dumps(value)`, except that each `Serialised` in it is written as its own text, as is.

    Each one first stands as a placeholder string carrying a random nonce (no text in the value can name it),
    which is then replaced by the text; the same object used twice (`data`, `structured_content`) is one."""
    texts: dict[int, tuple[str, str]] = {}
    nonce = ""

    def placeholder(item: Any) -> str:
        nonlocal nonce
        if not isinstance(item, Serialised):
            raise TypeError(f"Object of type {type(item).__name__} is not JSON serializable")
        nonce = nonce or secrets.token_hex(16)
        mark, _ = texts.setdefault(id(item), (f"serialised:{nonce}:{len(texts)}", item.text))
        return mark

    out = json.dumps(value, default=placeholder)
    for mark, text in texts.values():
        out = out.replace(json.dumps(mark), text)
    return out
