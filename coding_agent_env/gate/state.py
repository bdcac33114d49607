"""What the gate holds per registered rollout: its token and the agent calls waiting for the trainer.

Lives on the gate's owning loop only (see `coding_agent_env.gate.gate`).
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass
from typing import Any

from coding_agent_env.errors import RolloutClosedError

__all__ = ["GateRequest", "RolloutState"]


@dataclass(frozen=True)
class GateRequest:
    """One agent call waiting for the trainer's answer. `body` is the agent's request as sent."""

    id: str
    rollout_id: str
    body: dict[str, Any]

    @property
    def stream(self) -> bool:
        return self.body.get("stream") is True

    @property
    def messages(self) -> list[Any]:
        messages = self.body.get("messages")
        return messages if isinstance(messages, list) else []

    @property
    def tools(self) -> list[Any]:
        tools = self.body.get("tools")
        return tools if isinstance(tools, list) else []


class RolloutState:
    """Owning-loop state of one registered rollout."""

    def __init__(self, rollout_id: str, token: str) -> None:
        self.rollout_id = rollout_id
        self.token = token
        self.ready: collections.deque[GateRequest] = collections.deque()
        self.pending: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.changed = asyncio.Condition()
        self.closed: str | None = None
        """Why the rollout no longer takes calls (exited / unregistered), or None while open."""

    async def close(self, reason: str, *, fail_pending: bool) -> None:
        self.closed = self.closed or reason
        if fail_pending:
            for future in self.pending.values():
                if not future.done():
                    future.set_exception(RolloutClosedError(reason))
        async with self.changed:
            self.changed.notify_all()
