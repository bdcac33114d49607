"""One rollout's right to use the relay: its token, its upstream and its recorded turns.

A lease is created open by `Relay.open_lease` and lives on the relay's event loop. `close()` revokes the
token at once (every later call gets 401), cancels the rollout's calls still in flight (each is recorded
as a turn with an error), and is idempotent. `turns()` works before and after close.

The lease holds the rollout's current policy version (from `Upstream.policy_version`); an async trainer that
updates the weights mid-rollout moves it on with `set_policy_version`, and every call that starts afterwards
records the new one (a call already in flight keeps the version it started with).
"""

from __future__ import annotations

import asyncio
import enum
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from coding_agent_env.llm.upstream import Upstream
from coding_agent_env.models import Turn
from coding_agent_env.models.turns import policy_version_or_none
from coding_agent_env.settings import WireLimits

__all__ = ["Lease", "LeaseState", "PromptDelta", "TurnSource"]

_CLOSE_GRACE_S = 5.0
"""How long close() waits for cancelled in-flight calls to record their turns."""


class TurnSource(Protocol):
    """A finished call that can render its `Turn` (built lazily, off the response's hot path)."""

    def turn(self) -> Turn: ...


class LeaseState(enum.Enum):
    OPEN = "open"
    CLOSED = "closed"


@dataclass(slots=True, eq=False)
class PromptDelta:
    """The part of a call's prompt not already recorded by the previous call (see `Turn`)."""

    index: int
    reused: int
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    """The call's tools when they differ from the previous call's (None: none, or `tools_reused`)."""
    tools_reused: bool = False


class Lease:
    """A rollout's relay access. Give the agent `base_url` (or `socket_path`) and `token`, nothing else."""

    def __init__(
        self,
        rollout_id: str,
        upstream: Upstream,
        *,
        token: str,
        base_url: str,
        socket_path: Path,
        expires_at: float | None,
        revoke: Callable[[str], None],
        serve: Callable[[socket.socket], Awaitable[Callable[[], Awaitable[None]]]] | None = None,
    ) -> None:
        self.rollout_id = rollout_id
        self.upstream = upstream
        self.base_url = base_url
        """Loopback URL ending in `/v1`, for agents that share the server's network."""
        self.socket_path = socket_path
        """Unix socket serving the same API, for sandboxes without network (bind-mount it)."""
        self.serve = serve
        """The relay's `serve_listener`: serve the same API on a listening socket the caller made."""
        self._token = token
        self._expires_at = expires_at
        self._revoke = revoke
        self._state = LeaseState.OPEN
        self._turns: list[Turn | TurnSource] = []
        self._next_index = 0
        self._last_prompt: list[Any] = []
        self._last_tools: list[dict[str, Any]] | None = None
        self._inflight: set[asyncio.Task[Any]] = set()
        self._policy_version = upstream.policy_version

    def __repr__(self) -> str:
        return f"Lease(rollout_id={self.rollout_id!r}, base_url={self.base_url!r}, state={self._state.value})"

    @property
    def token(self) -> str:
        """The per-rollout bearer token; worthless once the lease is closed."""
        return self._token

    @property
    def closed(self) -> bool:
        return self._state is LeaseState.CLOSED

    def usable(self) -> bool:
        """Open and not past its expiry."""
        if self._state is LeaseState.CLOSED:
            return False
        return self._expires_at is None or time.monotonic() < self._expires_at

    @property
    def calls_started(self) -> int:
        return self._next_index

    @property
    def in_flight(self) -> int:
        """Calls being served now."""
        return len(self._inflight)

    @property
    def policy_version(self) -> str | None:
        """The policy version calls starting now record, unless their engine reports its own."""
        return self._policy_version

    def set_policy_version(self, version: str | None) -> None:
        """Move the rollout to `version` (None: none known) for every call that starts from now on; calls in
        flight keep theirs. `ValueError` for a value that is not a policy version (visible ASCII, at most
        `WireLimits.MAX_NAME_CHARS`); works on a closed lease too (no call starts there)."""
        if version is not None and policy_version_or_none(version) is None:
            raise ValueError(f"policy_version must be 1 to {WireLimits.MAX_NAME_CHARS} visible ASCII characters "
                             "(no spaces)")
        self._policy_version = version

    def turns(self) -> list[Turn]:
        """Every call recorded so far, in the order the calls arrived."""
        built = [entry if isinstance(entry, Turn) else entry.turn() for entry in self._turns]
        self._turns = list(built)
        return sorted(built, key=lambda turn: turn.turn)

    async def close(self) -> None:
        """Revoke the token, cancel calls in flight and wait (briefly) for their turns. Idempotent."""
        if self._state is LeaseState.CLOSED:
            return
        self._state = LeaseState.CLOSED
        self._revoke(self._token)
        pending = [task for task in self._inflight if task is not asyncio.current_task()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=_CLOSE_GRACE_S)

    async def __aenter__(self) -> Lease:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- used by the relay's handlers ---------------------------------------------------------------------

    def begin(self, messages: Any, tools: Any = None) -> PromptDelta:
        """Number a new call and work out which of its prompt messages (and whether its tools) are new since
        the previous call."""
        index = self._next_index
        self._next_index += 1
        current = messages if isinstance(messages, list) else []
        reused = 0
        for previous, message in zip(self._last_prompt, current):
            if previous != message:
                break
            reused += 1
        self._last_prompt = current
        fresh = [m for m in current[reused:] if isinstance(m, dict)]
        listed = [t for t in tools if isinstance(t, dict)] if isinstance(tools, list) else None
        same = index > 0 and listed == self._last_tools
        self._last_tools = listed
        return PromptDelta(index, reused, fresh, None if same else listed, same and listed is not None)

    def track(self, task: asyncio.Task[Any]) -> None:
        self._inflight.add(task)

    def untrack(self, task: asyncio.Task[Any]) -> None:
        self._inflight.discard(task)

    def record(self, turn: Turn | TurnSource) -> None:
        """Keep a finished call's turn (or its source, rendered on the first `turns()`)."""
        self._turns.append(turn)
