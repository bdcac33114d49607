"""The step path shared by `WS /ws` and `POST /step`: `reset`, and `list_tools` / `call_tool` actions
(PROTOCOL.md §3.5).

Tools come from the table (`api.tools`): `run_rollout` always, `terminal` while the session's interactive
episode lives; a `reset` with task fields starts that episode (`start_episode`'s job on MCP), as does a `reset`
naming a task of the server's task set (`split` and `index`, `split` and `seed`, or `task_id`: `api.tools.task_set`).
"""

from __future__ import annotations

import functools
from typing import Any

from coding_agent_env.api.protocols.shapes import (
    CallToolAction,
    ListToolsAction,
    ListToolsObservation,
    ToolErrorInfo,
    call_tool_payload,
    observation_payload,
)
from coding_agent_env.api.tools import START_EPISODE, ToolCallFailed, listing, openenv_tool
from coding_agent_env.api.tools.task_set import TaskRef, episode_task
from coding_agent_env.episode import is_task
from coding_agent_env.session import Session

__all__ = ["parse_action", "reset", "step"]

RESET_KEYS = frozenset({"seed", "episode_id"})
"""`reset` arguments of OpenEnv's own; a task field among the others starts an interactive episode."""
SESSION_KEYS = frozenset({"policy_version"})
"""`reset` arguments that set the session, not the task: `policy_version`, the trainer's current weights, which the
session's later rollouts record on their turns unless a request names its own (`Session.policy_version`)."""


def parse_action(data: dict[str, Any]) -> ListToolsAction | CallToolAction:
    """The step path's action: `list_tools`, else `call_tool` (ValidationError if neither fits)."""
    if data.get("type") == "list_tools":
        return ListToolsAction.model_validate(data)
    return CallToolAction.model_validate(data)


async def reset(session: Session, data: dict[str, Any]) -> dict[str, Any]:
    """`reset`: with task arguments, start an interactive episode (ending the session's previous one) and
    return its opening observation; naming a task of the set, that task's episode (its observation also has
    the task's public part, `task`); bare (only `seed` / `episode_id`), a new empty episode as before.
    `RequestError`s (bad task arguments, a task this server will not run) and `SessionClosedError` raise."""
    if "policy_version" in data:
        session.set_policy_version(data["policy_version"])
    data = {key: value for key, value in data.items() if key not in SESSION_KEYS}
    episode_id = data.get("episode_id")
    episode_id = None if episode_id is None else str(episode_id)
    task = {key: value for key, value in data.items() if key not in RESET_KEYS}
    ref = TaskRef.of(data, session.catalog, extra=RESET_KEYS)
    if ref is not None:
        chosen = ref.pick(session.catalog)
        reply = await START_EPISODE.start(session, episode_task(chosen, ref.group_id(data.get("group_id"))), episode_id)
        return {"observation": {**reply.data, "task": chosen.public()}, "reward": None, "done": reply.done}
    if is_task(task):
        reply = await START_EPISODE.start(session, START_EPISODE.validate(task), episode_id)
        return {"observation": reply.data, "reward": None, "done": reply.done}
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
    tool = openenv_tool(action.tool_name)
    try:
        if tool is None:
            raise ToolCallFailed("tool_not_found", f"Unknown tool: '{action.tool_name}'")
        reply = await tool.call(session, action.arguments)
    except ToolCallFailed as exc:
        error = ToolErrorInfo(error_type=exc.error_type, message=exc.message)  # type: ignore[arg-type]
        return call_tool_payload(action.tool_name, error=error)
    return call_tool_payload(tool.name, reply)


@functools.cache
def _list_tools_payload(live_episode: bool) -> dict[str, Any]:
    """Built once per variant: the tool lists never change while the server runs. Callers must not mutate it."""
    return observation_payload(ListToolsObservation(tools=listing("input_schema", live_episode)))
