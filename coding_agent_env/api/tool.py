"""The one tool, `run_rollout`, as every path presents it.

Its input schema is `RolloutRequest`'s JSON schema (same field names, defaults and descriptions); its result
is a `RolloutResult`. The step path and JSON-RPC return OpenEnv's tool-result dict (`data` = the result,
`content[0].text` = its JSON); real MCP returns structured content plus the same JSON text (mcp.py).
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic import ValidationError

from coding_agent_env.errors import InvalidTaskError, RequestError
from coding_agent_env.models import RolloutRequest, RolloutResult, request_fields_schema, validation_summary
from coding_agent_env.rollout.writable import check_writable
from coding_agent_env.session import Session, SessionClosedError

__all__ = [
    "TOOL_DESCRIPTION",
    "TOOL_NAME",
    "ToolCallFailed",
    "parse_arguments",
    "run_tool",
    "tool_descriptor",
    "tool_result_dict",
    "validation_summary",
]

TOOL_NAME = "run_rollout"
TOOL_DESCRIPTION = (
    "Run one coding-agent episode end to end in a fresh sandbox: write files, run setup commands, run the "
    "agent on the instruction, run verify commands, score, collect files, tear down. Returns a RolloutResult "
    "(status, reward in [0,1] or null, command results, files, LLM turns, timings)."
)


class ToolCallFailed(Exception):
    """A tool call that did not produce a result; `error_type` is one of OpenEnv's five kinds."""

    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.message = message


@functools.cache
def tool_descriptor(schema_key: str) -> dict[str, Any]:
    """`{name, description, <schema_key>}`: `input_schema` on the step path, `inputSchema` over JSON-RPC.

    Built once (schema generation is the costly part of a `list_tools`); callers must not mutate it."""
    return {"name": TOOL_NAME, "description": TOOL_DESCRIPTION, schema_key: request_fields_schema()}


def parse_arguments(name: str, arguments: Any) -> RolloutRequest:
    """Check the tool name and turn the arguments into a request, or raise ToolCallFailed."""
    if name != TOOL_NAME:
        raise ToolCallFailed("tool_not_found", f"Unknown tool: '{name}'")
    if not isinstance(arguments, dict):
        raise ToolCallFailed("invalid_args", f"Error calling tool '{name}': arguments must be an object")
    try:
        request = RolloutRequest.model_validate(arguments)
        check_writable(request)
    except ValidationError as exc:
        raise ToolCallFailed("invalid_args", f"Error calling tool '{name}': {validation_summary(exc)}") from None
    except InvalidTaskError as exc:
        raise ToolCallFailed("invalid_args", f"Error calling tool '{name}': {exc}") from None
    return request


def tool_result_dict(result: RolloutResult) -> dict[str, Any]:
    """OpenEnv's tool-result dict: clients read `data`; `content[0].text` is the same result as JSON."""
    data = result.model_dump(mode="json")
    return {
        "content": [{"type": "text", "text": result.model_dump_json(), "annotations": None, "meta": None}],
        "structured_content": data,
        "meta": None,
        "data": data,
        "is_error": False,
    }


async def run_tool(session: Session, name: str, arguments: Any) -> RolloutResult:
    """Run `run_rollout` in `session`. ToolCallFailed for a bad call or a request the server will not run;
    `SessionClosedError` (a session-level error, each path maps it) if the session runs nothing more.
    Anything that goes wrong *during* the rollout is in the result, not raised."""
    request = parse_arguments(name, arguments)
    try:
        return await session.run(request)
    except SessionClosedError:
        raise
    except RequestError as exc:
        raise ToolCallFailed("execution_error", f"Error calling tool '{name}': {exc}") from None
