"""`Tool`: one tool of the table, declared once and offered by every door (WS step, JSON-RPC, MCP, the web tab).

A tool declares its name, description, input schema and argument type, and two steps:

- `validate(arguments)`: the one place its arguments are checked, turned into what the session takes (a
  `RolloutRequest`, a `TerminalCall`, ...), or refused with a `RequestError` naming the bad field (never its
  value);
- `run(session, parsed)`: the call itself, returning a `ToolReply`; a `RequestError` means the call did not run
  (busy, no episode, a backend this server lacks); `SessionClosedError` passes through, each door maps it.

`call(session, arguments)` is both, with failures as `ToolCallFailed` (`invalid_args` or `execution_error`, the
message `Error calling tool '<name>': <why>`): what the doors turn into their own error shapes. Anything that
goes wrong *while* a call runs is data in its result, not an error.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel

from coding_agent_env.api.tools.reply import ToolReply
from coding_agent_env.errors import RequestError
from coding_agent_env.session import Session, SessionClosedError

__all__ = ["ArgumentsError", "Tool", "ToolCallFailed"]

A = TypeVar("A")


class ArgumentsError(RequestError):
    """A tool's arguments are not what it takes; nothing ran."""


class ToolCallFailed(Exception):
    """A tool call that did not produce a result; `error_type` is one of OpenEnv's five kinds."""

    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.message = message


class Tool(ABC, Generic[A]):
    """One tool. Instances are the table's entries (`api.tools.table`); they hold no per-call state."""

    name: ClassVar[str]
    description: ClassVar[str]
    openenv: ClassVar[bool] = True
    """Offered on OpenEnv's paths (step, JSON-RPC); False: MCP only (there `reset` does its job)."""
    output_model: ClassVar[type[BaseModel] | None] = None
    """The result's model, advertised as the MCP output schema (None: no output schema)."""

    @abstractmethod
    def schema(self) -> dict[str, Any]:
        """The input JSON schema (built once; callers must not mutate it)."""

    @abstractmethod
    def validate(self, arguments: Any) -> A:
        """The arguments as the session takes them, or a `RequestError` naming what is wrong."""

    @abstractmethod
    async def run(self, session: Session, arguments: A) -> ToolReply:
        """Run the validated call in `session`."""

    def offered(self, live_episode: bool) -> bool:
        """Whether a session lists (and a temporary session can run) this tool; `live_episode`: whether the
        session's interactive episode takes calls."""
        return True

    def mcp_parameters(self) -> list[tuple[str, Any]]:
        """(name, default) of each keyword the MCP tool declares: the schema's properties, None when not given."""
        return [(name, None) for name in self.schema()["properties"]]

    def mcp_arguments(self, given: dict[str, Any]) -> dict[str, Any]:
        """The arguments an MCP call carries (its keywords, defaults filled in): here those given (not None)."""
        return {name: value for name, value in given.items() if value is not None}

    def descriptor(self, schema_key: str) -> dict[str, Any]:
        """`{name, description, <schema_key>}`: `input_schema` on the step path, `inputSchema` over JSON-RPC.
        Built once per key; callers must not mutate it."""
        return _descriptor(self, schema_key)

    def parse(self, arguments: Any) -> A:
        """`validate`, its refusal as `ToolCallFailed("invalid_args")`."""
        try:
            return self.validate(arguments)
        except RequestError as exc:
            raise ToolCallFailed("invalid_args", self.error_message(exc)) from None

    async def call(self, session: Session, arguments: Any) -> ToolReply:
        """Validate and run; see the module contract."""
        parsed = self.parse(arguments)
        try:
            return await self.run(session, parsed)
        except SessionClosedError:
            raise
        except RequestError as exc:
            raise ToolCallFailed("execution_error", self.error_message(exc)) from None

    def error_message(self, exc: Exception) -> str:
        return f"Error calling tool '{self.name}': {exc}"


@functools.cache
def _descriptor(tool: Tool[Any], schema_key: str) -> dict[str, Any]:
    return {"name": tool.name, "description": tool.description, schema_key: tool.schema()}
