"""The step path shared by `WS /ws` and `POST /step`: `list_tools` and `call_tool` actions (PROTOCOL.md §3.5)."""

from __future__ import annotations

import functools
from typing import Any

from coding_agent_env.api.tool import TOOL_NAME, ToolCallFailed, run_tool, tool_descriptor, tool_result_dict
from coding_agent_env.api.wire import (
    CallToolAction,
    CallToolObservation,
    ListToolsAction,
    ListToolsObservation,
    ToolErrorInfo,
    observation_payload,
)
from coding_agent_env.session import Session

__all__ = ["parse_action", "step"]


def parse_action(data: dict[str, Any]) -> ListToolsAction | CallToolAction:
    """The step path's action: `list_tools`, else `call_tool` (ValidationError if neither fits)."""
    if data.get("type") == "list_tools":
        return ListToolsAction.model_validate(data)
    return CallToolAction.model_validate(data)


async def step(session: Session, data: dict[str, Any]) -> dict[str, Any]:
    """One step: validate the action (ValidationError), count it, run it; return the observation payload
    (`{"observation","reward","done"}`). Tool failures are data in the observation, not exceptions."""
    action = parse_action(data)
    session.count_step()
    if isinstance(action, ListToolsAction):
        return _list_tools_payload()
    try:
        result = await run_tool(session, action.tool_name, action.arguments)
    except ToolCallFailed as exc:
        error = ToolErrorInfo(error_type=exc.error_type, message=exc.message)  # type: ignore[arg-type]
        return observation_payload(CallToolObservation(tool_name=action.tool_name, error=error))
    observation = CallToolObservation(tool_name=TOOL_NAME, result=tool_result_dict(result), reward=result.reward)
    return observation_payload(observation)


@functools.cache
def _list_tools_payload() -> dict[str, Any]:
    """Built once: the tool list never changes while the server runs. Callers must not mutate it."""
    return observation_payload(ListToolsObservation(tools=[tool_descriptor("input_schema")]))
