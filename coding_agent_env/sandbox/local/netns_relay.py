"""The LLM relay served by the server itself inside a local sandbox's network namespace (root launchers only).

Under network policy `llm`, a spawned agent reaches the relay at `http://127.0.0.1:PORT/v1` of its network
namespace. With a root launcher and a relay that can serve a socket (`RelayEndpoint.serve`), the server serves
it there itself: no process inside, no extra hop. The first spawn is served in the sandbox's own namespace, on
the port reserved at create (bound, not listening: nothing is made on the agent's critical path, and setup
and verify commands, which run before and after it, find the port closed); a further spawn while one runs
gets a namespace of its own. Serving stops when the spawned process exits. Otherwise the spawned command
brings a forwarder (see `launch`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from coding_agent_env.errors import SandboxError
from coding_agent_env.sandbox.base import RelayEndpoint
from coding_agent_env.sandbox.local import netns
from coding_agent_env.sandbox.local.provision import close_namespace

__all__ = ["RelayServing", "Served"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Served:
    """The relay served for one spawn: how to stop it (idempotent; it also closes a namespace made for the
    spawn), and the network namespace made for that spawn alone (our descriptor), or None when it serves in
    the sandbox's own."""

    stop: Callable[[], Awaitable[None]]
    netns: int | None = None


class RelayServing:
    """The relay served to one sandbox's spawns. `reserved`: bound to the relay port in the sandbox's
    namespace (not listening) until the first spawn serves the relay on it."""

    def __init__(self, relay: RelayEndpoint, port: int, reserved: socket.socket | None) -> None:
        assert relay.serve is not None
        self._relay = relay
        self._port = port
        self._reserved = reserved
        self._served: list[asyncio.Future[Served]] = []
        """Every serving started for a spawn: what close() stops."""
        self._stopping: set[asyncio.Future[None]] = set()

    async def serve_for_spawn(self) -> Served | None:
        """Serve the relay for one spawn until it exits (the caller stops it then); None when the spawn must
        bring the forwarder instead (no namespace to be had)."""
        reserved, self._reserved = self._reserved, None
        started = asyncio.ensure_future(self._serve_on(reserved) if reserved is not None else self._serve_apart())
        self._served.append(started)  # registered before any await: close() stops it however this call ends
        try:
            return await asyncio.shield(started)
        except asyncio.CancelledError:
            # No process will stop it: stop it as soon as it serves, so verify (which still runs after a
            # cancelled agent stage) finds the port closed.
            started.add_done_callback(self._stop_unclaimed)
            raise
        except OSError as exc:
            log.warning("no network namespace for an agent, it brings the relay forwarder: %s", exc)
            return None
        except Exception as exc:
            raise SandboxError(f"the relay cannot serve the agent's network namespace: {exc}") from exc

    def release_reserved(self) -> None:
        """Close the reserved port (synchronously: close() does it before its first await)."""
        if self._reserved is not None:
            self._reserved.close()
            self._reserved = None

    async def close(self) -> None:
        """Stop every serving started (waiting for those still starting). Idempotent."""
        self.release_reserved()
        serving, self._served = self._served, []
        for started in serving:
            try:
                served = await started
            except BaseException:  # never served: what it made is closed already
                continue
            await served.stop()

    def _stop_unclaimed(self, started: asyncio.Future[Served]) -> None:
        if started.cancelled() or started.exception() is not None:
            return
        stopping = asyncio.ensure_future(started.result().stop())
        self._stopping.add(stopping)  # referenced until done (close() stops it too: stop is idempotent)
        stopping.add_done_callback(self._stopping.discard)

    async def _serve_on(self, sock: socket.socket, fd: int | None = None) -> Served:
        """Serve the relay on `sock`; `fd`, the namespace made for it alone, is closed by the returned stop."""
        assert self._relay.serve is not None
        try:
            stop_serving = await self._relay.serve(sock)  # owns the socket from the call on
        except BaseException:
            if fd is not None:
                os.close(fd)
            raise
        released = False

        async def stop() -> None:
            nonlocal released
            await stop_serving()
            if fd is not None and not released:
                released = True
                os.close(fd)  # the namespace goes with its listener and its last process

        return Served(stop, fd)

    async def _serve_apart(self) -> Served:
        made = asyncio.ensure_future(asyncio.to_thread(netns.begin_netns(self._port)))
        try:
            fd, listener = await asyncio.shield(made)
        except asyncio.CancelledError:
            made.add_done_callback(_discard_namespace)  # the thread still finishes: close what it made
            raise
        assert listener is not None
        return await self._serve_on(listener, fd)


def _discard_namespace(made: asyncio.Future[tuple[int, socket.socket | None]]) -> None:
    if not made.cancelled() and made.exception() is None:
        close_namespace(*made.result())
