"""OpenEnv wire shapes (PROTOCOL.md §2-§4), as strict pydantic models and small serializers.

Only shapes live here; behaviour is in ws.py, jsonrpc.py and http.py. Every inbound envelope forbids extra
keys, as OpenEnv's do, so `{"type":"state","data":{}}` is a validation error.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt

__all__ = [
    "CallToolAction",
    "CallToolObservation",
    "EnvState",
    "JsonRpcRequest",
    "ListToolsAction",
    "ListToolsObservation",
    "ToolErrorInfo",
    "ToolErrorType",
    "WS_ENVELOPES",
    "loads_bounded",
    "observation_payload",
    "rpc_error",
    "rpc_result",
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


class EnvState(BaseModel):
    """The `state` reply: OpenEnv's State (episode_id, step_count) plus this environment's fields."""

    model_config = ConfigDict(extra="allow")

    episode_id: str | None = None
    step_count: NonNegativeInt = 0
    rollouts_completed: NonNegativeInt = 0
    last_reward: float | None = None
    last_status: str | None = None


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
