"""`CodingAgentEnv`: a typed client for this server over `WS /ws` (async, with a `.sync()` wrapper).

    async with CodingAgentEnv("http://127.0.0.1:8000") as env:
        await env.reset()
        result = await env.run_rollout(instruction="...", agent="oracle", solution=[...], verify=[...])
        state = await env.state()

    with CodingAgentEnv("http://127.0.0.1:8000").sync() as env:
        result = env.run_rollout(request)

Each call sends one envelope and waits for its one reply. `run_rollout` waits as long as the request's own
deadline (the sum of its stage budgets) plus `reply_margin_s`; other calls wait `reply_timeout_s`. A timeout
closes the socket (a late reply must never be paired with the next request). Error frames raise
`ServerError`; a tool failure raises `ToolCallError`. Whatever went wrong *inside* a rollout is in the
returned `RolloutResult`, not raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, TypeVar

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from coding_agent_env.env_state import EnvState
from coding_agent_env.errors import CodingAgentEnvError
from coding_agent_env.models import RolloutRequest, RolloutResult
from coding_agent_env.settings import Settings
from coding_agent_env.urls import caller_headers, ws_url
from coding_agent_env.workspace.budget import Budget

__all__ = [
    "ClientError",
    "CodingAgentEnv",
    "EnvState",
    "EpisodeState",
    "ServerError",
    "SyncCodingAgentEnv",
    "ToolCallError",
]

T = TypeVar("T")
_MIB = 1024 * 1024


class ClientError(CodingAgentEnvError):
    """The client could not get an answer (not connected, timed out, unexpected reply)."""


class ServerError(ClientError):
    """The server answered with an error frame."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class ToolCallError(ClientError):
    """The tool call itself failed (`error_type`: invalid_args, execution_error, tool_not_found, ...)."""

    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(f"{error_type}: {message}")
        self.error_type = error_type


EpisodeState = EnvState
"""The session's `state` (the server's own model, `env_state.EnvState`; this name is kept for callers)."""


class CodingAgentEnv:
    """Async client; one WebSocket, one server session."""

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout_s: float = 10.0,
        reply_timeout_s: float = 60.0,
        reply_margin_s: float = 60.0,
        max_message_bytes: int = 100 * _MIB,
        api_token: str | None = None,
    ) -> None:
        """`api_token`: the server's caller token (sent as `X-API-Token`); default `API_TOKEN` from the
        environment, none when unset."""
        self.url = ws_url(base_url)
        self._headers = caller_headers(api_token)
        self.connect_timeout_s = connect_timeout_s
        self.reply_timeout_s = reply_timeout_s
        self.reply_margin_s = reply_margin_s
        self.max_message_bytes = max_message_bytes
        self._ws: ClientConnection | None = None

    async def connect(self) -> None:
        if self._ws is None:
            self._ws = await connect(self.url, open_timeout=self.connect_timeout_s, max_size=self.max_message_bytes,
                                     additional_headers=self._headers)

    async def reset(self, episode_id: str | None = None, **kwargs: Any) -> None:
        """Start a new episode (step count 0)."""
        data = {**kwargs, **({"episode_id": episode_id} if episode_id is not None else {})}
        await self._ask({"type": "reset", "data": data}, self.reply_timeout_s)

    async def run_rollout(self, request: RolloutRequest | None = None, /, **fields: Any) -> RolloutResult:
        """Run one rollout: pass a RolloutRequest, or its fields as keywords."""
        if request is None:
            request = RolloutRequest.model_validate(fields)
        elif fields:
            raise TypeError("pass either a RolloutRequest or its fields, not both")
        arguments = request.model_dump(mode="json", exclude_unset=True)
        if request.api_key is not None:
            arguments["api_key"] = request.api_key.get_secret_value()
        action = {"type": "call_tool", "tool_name": "run_rollout", "arguments": arguments}
        reply = await self._ask({"type": "step", "data": action}, self.deadline_for(request))
        observation = reply["data"]["observation"]
        if observation.get("error"):
            raise ToolCallError(observation["error"]["error_type"], observation["error"]["message"])
        return RolloutResult.model_validate(observation["result"]["data"])

    def deadline_for(self, request: RolloutRequest) -> float:
        """How long to wait for a rollout's reply: its stage budgets (default server settings) plus a margin."""
        return Budget.for_request(request, Settings()).total_s + self.reply_margin_s

    async def state(self) -> EnvState:
        reply = await self._ask({"type": "state"}, self.reply_timeout_s)
        return EnvState.model_validate(reply["data"])

    async def close(self) -> None:
        """Send `close` and drop the socket (the server frees the session). Idempotent."""
        ws, self._ws = self._ws, None
        if ws is None:
            return
        try:
            with contextlib.suppress(ConnectionClosed):  # the server may already have gone; still close ours
                await ws.send(json.dumps({"type": "close"}))
        finally:
            await ws.close()

    async def _ask(self, message: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        await self.connect()
        assert self._ws is not None
        try:
            async with asyncio.timeout(timeout_s):
                reply = json.loads(await self._exchange(self._ws, json.dumps(message)))
        except TimeoutError:
            await self._drop()
            raise ClientError(f"no reply to {message['type']!r} within {timeout_s:.0f}s; connection closed") from None
        except ConnectionClosed as exc:
            self._ws = None
            raise ClientError(f"the server closed the connection ({exc.rcvd.code if exc.rcvd else 'no code'})") from None
        if reply.get("type") == "error":
            data = reply.get("data") or {}
            raise ServerError(str(data.get("code")), str(data.get("message")))
        return reply

    @staticmethod
    async def _exchange(ws: ClientConnection, text: str) -> str | bytes:
        """Send and receive one frame. If the server already closed (a refusal), its queued error frame is
        still the answer."""
        try:
            await ws.send(text)
        except ConnectionClosed:
            return await ws.recv()
        return await ws.recv()

    async def _drop(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            await ws.close()

    async def __aenter__(self) -> CodingAgentEnv:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def sync(self) -> SyncCodingAgentEnv:
        return SyncCodingAgentEnv(self)


class SyncCodingAgentEnv:
    """Blocking wrapper: runs the async client on a private event loop in a daemon thread."""

    def __init__(self, client: CodingAgentEnv) -> None:
        self.client = client
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="coding-agent-env-client", daemon=True)
        self._thread.start()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def connect(self) -> None:
        self._run(self.client.connect())

    def reset(self, episode_id: str | None = None, **kwargs: Any) -> None:
        self._run(self.client.reset(episode_id, **kwargs))

    def run_rollout(self, request: RolloutRequest | None = None, /, **fields: Any) -> RolloutResult:
        return self._run(self.client.run_rollout(request, **fields))

    def state(self) -> EnvState:
        return self._run(self.client.state())

    def close(self) -> None:
        """Close the connection and stop the private loop. Idempotent."""
        if self._loop.is_closed():
            return
        try:
            self._run(self.client.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    def __enter__(self) -> SyncCodingAgentEnv:
        self.connect()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
