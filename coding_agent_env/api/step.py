"""The step path shared by `WS /ws` and `POST /step`: `list_tools` and `call_tool` actions (PROTOCOL.md §3.5).

Tools: `run_rollout` always; `terminal` while the session's interactive episode lives (api.terminal).
"""

from __future__ import annotations

import functools
from typing import Any

from coding_agent_env.api.terminal import TERMINAL_TOOL, episode_observation, run_terminal, tool_list
from coding_agent_env.api.tool import TOOL_NAME, ToolCallFailed, run_tool, tool_result_dict
from coding_agent_env.api.wire import (
    CallToolAction,
    CallToolObservation,
    ListToolsAction,
    ListToolsObservation,
    ToolErrorInfo,
    observation_payload,
)
from coding_agent_env.episode import is_task
from coding_agent_env.session import Session

__all__ = ["parse_action", "reset", "step"]

RESET_KEYS = frozenset({"seed", "episode_id"})
"""`reset` arguments of OpenEnv's own; a task field among the others starts an interactive episode."""


def parse_action(data: dict[str, Any]) -> ListToolsAction | CallToolAction:
    """The step path's action: `list_tools`, else `call_tool` (ValidationError if neither fits)."""
    if data.get("type") == "list_tools":
        return ListToolsAction.model_validate(data)
    return CallToolAction.model_validate(data)


async def reset(session: Session, data: dict[str, Any]) -> dict[str, Any]:
    """`reset`: with task arguments, start an interactive episode (ending the session's previous one) and
    return its opening observation; bare (only `seed` / `episode_id`), a new empty episode as before.
    `RequestError`s (bad task arguments, a task this server will not run) and `SessionClosedError` raise."""
    episode_id = data.get("episode_id")
    episode_id = None if episode_id is None else str(episode_id)
    task = {key: value for key, value in data.items() if key not in RESET_KEYS}
    if is_task(task):
        episode = await session.start_episode(task, episode_id)
        return episode_observation(episode)
    await session.end_episode()
    session.reset(episode_id)
    return {"observation": {}, "reward": None, "done": False}


async def step(session: Session, data: dict[str, Any]) -> dict[str, Any]:
    """One step: validate the action (ValidationError), count it, run it; return the observation payload
    (`{"observation","reward","done"}`). Tool failures are data in the observation, not exceptions."""
    action = parse_action(data)
    session.count_step()
    if isinstance(action, ListToolsAction):
        return _list_tools_payload(session.live_episode is not None)
    try:
        observation = await _call(session, action)
    except ToolCallFailed as exc:
        error = ToolErrorInfo(error_type=exc.error_type, message=exc.message)  # type: ignore[arg-type]
        return observation_payload(CallToolObservation(tool_name=action.tool_name, error=error))
    return observation_payload(observation)


async def _call(session: Session, action: CallToolAction) -> CallToolObservation:
    if action.tool_name == TERMINAL_TOOL:
        outcome = await run_terminal(session, action.arguments)
        return CallToolObservation(tool_name=TERMINAL_TOOL, result=outcome.result, reward=outcome.reward,
                                   done=outcome.done)
    result = await run_tool(session, action.tool_name, action.arguments)
    return CallToolObservation(tool_name=TOOL_NAME, result=tool_result_dict(result), reward=result.reward)


@functools.cache
def _list_tools_payload(with_terminal: bool) -> dict[str, Any]:
    """Built once per variant: the tool lists never change while the server runs. Callers must not mutate it."""
    return observation_payload(ListToolsObservation(tools=tool_list("input_schema", terminal=with_terminal)))
