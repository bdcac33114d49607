"""`run_rollout`: one rollout end to end in a fresh sandbox, in the caller's session.

Its input schema is `RolloutRequest`'s (same field names, defaults and descriptions); its arguments are
validated by that model and `check_writable` (file texts a file can hold); its result is the `RolloutResult`,
serialised once (`ToolReply.of`), whose JSON is also its text. Arguments with `split` (and `index`, or `seed`
for a group) run that task of the server's task set with the call's agent fields (`api.tools.task_set`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from coding_agent_env.api.tools.base import ArgumentsError, Tool
from coding_agent_env.api.tools.reply import ToolReply
from coding_agent_env.api.tools.task_set import AGENT_FIELDS, GROUP_KEY, REF_KEYS, TaskRef, rollout_request
from coding_agent_env.models import RolloutRequest, RolloutResult, request_fields_schema, validation_summary
from coding_agent_env.session import Session
from coding_agent_env.workspace.writable import check_writable

__all__ = ["TOOL_DESCRIPTION", "TOOL_NAME", "RunRollout"]

TOOL_NAME = "run_rollout"
TOOL_DESCRIPTION = (
    "Run one coding-agent episode end to end in a fresh sandbox: write files, run setup commands, run the "
    "agent on the instruction, run verify commands, score, collect files, tear down. Returns a RolloutResult "
    "(status, reward in [0,1] or null, command results, files, LLM turns, timings)."
)


@dataclass(frozen=True)
class SetRollout:
    """A rollout of a task of the server's set: which task, and the call's agent fields."""

    ref: TaskRef
    agent_fields: dict[str, Any]


class RunRollout(Tool[RolloutRequest | SetRollout]):
    name = TOOL_NAME
    description = TOOL_DESCRIPTION
    output_model = RolloutResult

    def schema(self) -> dict[str, Any]:
        return request_fields_schema()

    def validate(self, arguments: Any) -> RolloutRequest | SetRollout:
        if not isinstance(arguments, dict):
            raise ArgumentsError("arguments must be an object")
        given = {key: value for key, value in arguments.items() if value is not None}  # MCP fills in None
        if REF_KEYS & set(given):
            agent = {key: value for key, value in given.items() if key in AGENT_FIELDS or key == GROUP_KEY}
            ref = TaskRef.of(given, extra=frozenset(agent))
            assert ref is not None  # REF_KEYS make one
            return SetRollout(ref, agent)
        try:
            request = RolloutRequest.model_validate(arguments)
        except ValidationError as exc:
            raise ArgumentsError(validation_summary(exc)) from None
        check_writable(request)  # InvalidTaskError: a RequestError naming the file
        return request

    async def run(self, session: Session, arguments: RolloutRequest | SetRollout) -> ToolReply:
        if isinstance(arguments, SetRollout):
            ref, fields = arguments.ref, dict(arguments.agent_fields)
            group = ref.group_id(fields.pop(GROUP_KEY, None))
            fields.update({} if group is None else {GROUP_KEY: group})
            arguments = rollout_request(ref.pick(session.catalog), fields)
        result = await session.run(arguments)
        return ToolReply.of(result, reward=result.reward)

    def mcp_parameters(self) -> list[tuple[str, Any]]:
        """Every request field with the model's own default (required ones without one, so the MCP server
        refuses a call lacking them)."""
        return [
            (name, inspect.Parameter.empty if field.is_required() else field.get_default(call_default_factory=True))
            for name, field in RolloutRequest.model_fields.items()
        ]

    def mcp_arguments(self, given: dict[str, Any]) -> dict[str, Any]:
        return given
