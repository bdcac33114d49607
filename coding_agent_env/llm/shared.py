"""One LLM relay shared by every session of a server, started on first use on the server's loop."""

from __future__ import annotations

import asyncio

from coding_agent_env.llm.relay import Relay
from coding_agent_env.settings import Settings

__all__ = ["SharedRelay"]


class SharedRelay:
    """Lazily started relay: `await get()` from the server's loop; `stop()` at shutdown (idempotent)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._relay: Relay | None = None
        self._lock = asyncio.Lock()

    @property
    def running(self) -> Relay | None:
        """The relay once started (and until stopped); None before any rollout needed it."""
        return self._relay

    async def get(self) -> Relay:
        async with self._lock:
            if self._relay is None:
                relay = Relay(self._settings)
                await relay.start()
                self._relay = relay
            return self._relay

    async def stop(self) -> None:
        async with self._lock:
            if self._relay is not None:
                await self._relay.stop()
                self._relay = None
