"""`reset`'s task arguments -> the task of an interactive episode.

An episode's task is a `models.Task` (the fields a rollout's request has for its task, validated by the same
model: the same caps, path rules and limits), but the two only an agent run uses (`solution`, the oracle
agent's commands and files, `agent_timeout_s`: an episode has its own deadlines, and a multi-step task's `steps`),
plus the names upstream
`terminus_env` accepts:
`setup_scripts` / `verify_scripts` (a string or a list of strings; blank entries dropped) for `setup` /
`verify`, and `sandbox_backend` for `sandbox`. Giving both names of one field is an error, as is any other
key. The agent fields (agent, endpoint, key, model) do not belong to an episode: the trainer is the agent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from coding_agent_env.episode.errors import TaskArgumentsError
from coding_agent_env.errors import InvalidTaskError
from coding_agent_env.models import RolloutRequest, Task, validation_summary
from coding_agent_env.workspace.writable import check_writable

__all__ = ["AGENT_RUN_FIELDS", "TASK_FIELDS", "UPSTREAM_ALIASES", "is_task", "parse_task", "task_schema"]

AGENT_RUN_FIELDS = frozenset({"solution", "solution_files", "solution_env", "agent_timeout_s", "steps", "step_reward"})
"""Task fields that only an agent run uses: in an episode the trainer is the agent (and a multi-step task, whose
steps each have an agent's run, is a rollout's)."""
TASK_FIELDS = frozenset(Task.model_fields) - AGENT_RUN_FIELDS
"""What `reset` takes: every task field (a new one in `models.Task` arrives here by itself) but the above."""
UPSTREAM_ALIASES = {"setup_scripts": "setup", "verify_scripts": "verify", "sandbox_backend": "sandbox"}
"""terminus_env's names -> ours."""
_SCRIPT_LISTS = frozenset({"setup_scripts", "verify_scripts"})


def is_task(arguments: Mapping[str, Any]) -> bool:
    """Whether `reset`'s arguments ask for an episode (any task field or alias); a bare reset does not."""
    return any(key in TASK_FIELDS or key in UPSTREAM_ALIASES for key in arguments)


def parse_task(arguments: Mapping[str, Any]) -> RolloutRequest:
    """The episode's task (a `Task`; as the `RolloutRequest` of agent `nop`, the form it always had), or `TaskArgumentsError` naming each bad
    field (never its value)."""
    unknown = sorted(str(key) for key in arguments if key not in TASK_FIELDS and key not in UPSTREAM_ALIASES)
    if unknown:
        raise TaskArgumentsError(f"unknown task field(s): {', '.join(unknown[:10])}")
    fields: dict[str, Any] = {key: value for key, value in arguments.items() if key in TASK_FIELDS}
    for alias, name in UPSTREAM_ALIASES.items():
        if alias not in arguments:
            continue
        if name in fields:
            raise TaskArgumentsError(f"give either {name} or {alias}, not both")
        value = arguments[alias]
        fields[name] = _script_list(alias, value) if alias in _SCRIPT_LISTS else value
    try:
        task = RolloutRequest.model_validate({**fields, "agent": "nop"})
        check_writable(task)
    except ValidationError as exc:
        raise TaskArgumentsError(f"invalid task: {validation_summary(exc)}") from None
    except InvalidTaskError as exc:
        raise TaskArgumentsError(f"invalid task: {exc}") from None
    return task


def _script_list(alias: str, value: Any) -> list[str]:
    """A string or a list of strings, blank entries dropped (as upstream does)."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        raise TaskArgumentsError(f"{alias} must be a string or a list of strings")
    return [item for item in items if item.strip()]


def task_schema() -> dict[str, Any]:
    """JSON schema of the task arguments (what an MCP client's `start_episode` takes)."""
    full = Task.model_json_schema()
    properties = {name: spec for name, spec in full["properties"].items() if name in TASK_FIELDS}
    scripts = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}
    properties["setup_scripts"] = {**scripts, "description": "Upstream's name for setup (blank entries dropped)."}
    properties["verify_scripts"] = {**scripts, "description": "Upstream's name for verify (blank entries dropped)."}
    properties["sandbox_backend"] = {"type": "string", "description": "Upstream's name for sandbox."}
    schema: dict[str, Any] = {"type": "object", "properties": properties, "required": ["instruction"],
                              "additionalProperties": False}
    if "$defs" in full:
        schema["$defs"] = full["$defs"]
    return schema
