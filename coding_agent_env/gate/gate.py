"""The gate: a trainer-side OpenAI-compatible server where the trainer answers every agent call itself.

    gate = Gate(settings); await gate.start()                    # its loop becomes the owning loop
    rollout = await gate.register()                              # rollout.base_url + rollout.token go to run_rollout
    request = await gate.next_request(rollout.rollout_id, timeout=60)
    await gate.deliver(request, completion)                      # a chat.completion dict (or openai object)
    await gate.unregister(rollout.rollout_id)                    # waiting calls fail with a clear error

Threads and loops: every public coroutine may be awaited from any thread's event loop. The gate's state lives
on the owning loop only; calls from elsewhere are handed over with `run_coroutine_threadsafe` (that is,
`call_soon_threadsafe`) and their results handed back, so no table is touched from two threads.

Per-rollout tokens guard every HTTP route (`/v1/chat/completions`, `/v1/models`, `/v1/exit`): a missing or
foreign token gets 401. `POST /v1/exit` marks the rollout finished: waiting `next_request` calls and
`async for` loops end with `RolloutClosedError` / stop, later agent calls get 410.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import web

from coding_agent_env.errors import (
    GateError,
    GateTimeoutError,
    RolloutClosedError,
    UnknownRequestError,
    UnknownRolloutError,
)
from coding_agent_env.gate.server import build_app
from coding_agent_env.gate.state import GateRequest, RolloutState
from coding_agent_env.gate.synth import normalize_completion
from coding_agent_env.settings import Settings

__all__ = ["Gate", "GateRollout"]

T = TypeVar("T")
_TOKEN_PREFIX = "cag-"


@dataclass(frozen=True)
class GateRollout:
    """What the trainer passes to `run_rollout`: `base_url` and `api_key=token`."""

    rollout_id: str
    base_url: str
    token: str = field(repr=False)


class Gate:
    """See the module docstring. `async with Gate(settings) as gate:` starts and stops it."""

    def __init__(self, settings: Settings | None = None, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self._settings = settings or Settings()
        self._host = host
        self._port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._rollouts: dict[str, RolloutState] = {}
        self._tokens: dict[str, str] = {}

    # -- lifecycle -----------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen on host:port (127.0.0.1 and an OS-chosen port by default) from the current loop."""
        if self._loop is not None:
            raise GateError("gate already started")
        self._loop = asyncio.get_running_loop()
        self._runner = web.AppRunner(build_app(self, self._settings), access_log=None, handle_signals=False)
        await self._runner.setup()
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # accepted sockets inherit it
        sock.bind((self._host, self._port))
        self._port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()

    async def stop(self) -> None:
        """Unregister every rollout (failing their waiting calls) and stop listening. Idempotent."""
        if self._runner is None:
            return
        await self._on_owner(self._stop)

    async def _stop(self) -> None:
        for rollout_id in list(self._rollouts):
            await self._unregister(rollout_id)
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> Gate:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def base_url(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self._port}/v1"

    # -- trainer API (any thread, any loop) -----------------------------------------------------------------

    async def register(self, rollout_id: str | None = None) -> GateRollout:
        """Register a rollout (a fresh id unless given) and mint its token. `GateError` if the id is taken."""
        return await self._on_owner(self._register, rollout_id or uuid.uuid4().hex)

    async def unregister(self, rollout_id: str) -> None:
        """Forget a rollout: its token stops working, its waiting calls get 410, its waiters get
        `RolloutClosedError`. Unknown ids are ignored (idempotent)."""
        await self._on_owner(self._unregister, rollout_id)

    async def next_request(self, rollout_id: str, timeout: float | None = None) -> GateRequest:
        """The rollout's next unanswered call, in arrival order. Raises `GateTimeoutError` after `timeout`
        seconds, `RolloutClosedError` once the rollout exited or was unregistered, `UnknownRolloutError`."""
        return await self._on_owner(self._next_request, rollout_id, timeout)

    async def deliver(self, request: GateRequest, response: Any) -> None:
        """Answer `request` with a chat completion (mapping or object with `model_dump()`). Raises
        `InvalidResponseError` for a malformed answer, `UnknownRequestError` if nobody waits for it anymore."""
        completion = normalize_completion(response, _str(request.body.get("model")))
        await self._on_owner(self._deliver, request, completion)

    async def requests(self, rollout_id: str) -> AsyncIterator[GateRequest]:
        """Every call of the rollout until it exits or is unregistered."""
        while True:
            try:
                yield await self.next_request(rollout_id)
            except (RolloutClosedError, UnknownRolloutError):
                return

    # -- owning-loop implementations ---------------------------------------------------------------------

    async def _on_owner(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        owner = self._loop
        if owner is None:
            raise GateError("gate not started")
        if asyncio.get_running_loop() is owner:
            return await fn(*args)
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(fn(*args), owner))

    async def _register(self, rollout_id: str) -> GateRollout:
        if rollout_id in self._rollouts:
            raise GateError(f"rollout {rollout_id!r} is already registered")
        token = _TOKEN_PREFIX + secrets.token_urlsafe(32)
        self._rollouts[rollout_id] = RolloutState(rollout_id, token)
        self._tokens[token] = rollout_id
        return GateRollout(rollout_id=rollout_id, base_url=self.base_url, token=token)

    async def _unregister(self, rollout_id: str) -> None:
        state = self._rollouts.pop(rollout_id, None)
        if state is None:
            return
        self._tokens.pop(state.token, None)
        await state.close(f"rollout {rollout_id!r} was unregistered by the trainer", fail_pending=True)

    async def _next_request(self, rollout_id: str, timeout: float | None) -> GateRequest:
        state = self._state(rollout_id)
        try:
            async with asyncio.timeout(timeout), state.changed:
                while True:
                    while state.ready:
                        request = state.ready.popleft()
                        if request.id in state.pending:
                            return request
                    if state.closed is not None:
                        raise RolloutClosedError(state.closed)
                    await state.changed.wait()
        except TimeoutError:
            raise GateTimeoutError(f"no request from rollout {rollout_id!r} within {timeout} s") from None

    async def _deliver(self, request: GateRequest, completion: dict[str, Any]) -> None:
        state = self._rollouts.get(request.rollout_id)
        future = state.pending.get(request.id) if state is not None else None
        if future is None or future.done():
            raise UnknownRequestError(f"request {request.id} of rollout {request.rollout_id!r} is not waiting")
        future.set_result(completion)

    def _state(self, rollout_id: str) -> RolloutState:
        state = self._rollouts.get(rollout_id)
        if state is None:
            raise UnknownRolloutError(f"rollout {rollout_id!r} is not registered")
        return state

    # -- used by the HTTP handlers (owning loop) ---------------------------------------------------------

    def rollout_for_token(self, token: str | None) -> RolloutState | None:
        rollout_id = self._tokens.get(token) if token is not None else None
        return self._rollouts.get(rollout_id) if rollout_id is not None else None

    async def submit(self, state: RolloutState, body: dict[str, Any]) -> dict[str, Any]:
        """Queue an agent call and wait for its answer (bounded by `gate_request_timeout_s`)."""
        if state.closed is not None:
            raise RolloutClosedError(state.closed)
        request = GateRequest(id=uuid.uuid4().hex, rollout_id=state.rollout_id, body=body)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        state.pending[request.id] = future
        try:
            async with state.changed:
                state.ready.append(request)
                state.changed.notify_all()
            async with asyncio.timeout(self._settings.gate_request_timeout_s):
                return await future
        finally:
            state.pending.pop(request.id, None)

    async def mark_exited(self, state: RolloutState) -> None:
        await state.close(f"rollout {state.rollout_id!r} exited", fail_pending=False)


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None
