"""`CodingAgentEnv`: a typed client for this server over `WS /ws` (async, with a `.sync()` wrapper).

    async with CodingAgentEnv("http://127.0.0.1:8000") as env:
        result = await env.run_rollout(instruction="...", agent="oracle", solution=[...], verify=[...])
        state = await env.state()

    with CodingAgentEnv("http://127.0.0.1:8000").sync() as env:    # an interactive episode
        start = env.reset(instruction="...", verify=[...])             # EpisodeStart
        out = env.terminal("ls")                                        # TerminalResult
        report = env.final_answer("done")                               # EpisodeReport (reward, done)

Each call sends one envelope and waits for its one reply. `run_rollout` waits as long as the request's own
deadline (the sum of its stage budgets) plus `reply_margin_s`; an episode's calls wait their stage's budget for
the task `reset` started (`Budget`: provision and setup, one command, verify) plus `reply_margin_s`, or the
episode's whole deadline (`EPISODE_TIMEOUT_S`'s default) for a task the client cannot see (one of the server's
set); other calls wait `reply_timeout_s`. A timeout closes the socket (a late reply must never be paired with
the next request). Error frames raise `ServerError`; a tool failure (a refused command, an episode that has
ended) raises `ToolCallError`. Whatever went wrong *inside* a rollout or an episode is in the returned
`RolloutResult` / `EpisodeReport`, not raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from coding_agent_env.env_state import EnvState
from coding_agent_env.episode import EpisodeReport, TerminalResult, is_task, parse_task
from coding_agent_env.episode.errors import TaskArgumentsError
from coding_agent_env.errors import CodingAgentEnvError
from coding_agent_env.models import RolloutRequest, RolloutResult
from coding_agent_env.settings import Settings
from coding_agent_env.urls import caller_headers, ws_url
from coding_agent_env.workspace.budget import STAGE_SLACK_S, Budget

__all__ = [
    "ClientError",
    "CodingAgentEnv",
    "EnvState",
    "EpisodeReport",
    "EpisodeStart",
    "EpisodeState",
    "ServerError",
    "StepReply",
    "SyncCodingAgentEnv",
    "TerminalResult",
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

_RESET_KEYS = frozenset({"seed", "episode_id", "policy_version"})
"""`reset` arguments that say nothing of a task: with only these, a bare reset (answered at once)."""


class StepReply(BaseModel):
    """One `step`'s reply, as OpenEnv shapes it: the observation, its reward (null when unscored) and `done`."""

    model_config = ConfigDict(extra="allow")

    observation: dict[str, Any] = Field(default_factory=dict)
    reward: float | None = None
    done: bool = False


class EpisodeStart(BaseModel):
    """What `reset` answers. With a task: the instruction, the episode's report (setup results, status, sandbox,
    isolation; `done` when setup already ended it), the tools it offers and its opening as one text; naming a
    task of the server's set, also that task's public part (`task`). A bare `reset` (no task) answers it empty."""

    model_config = ConfigDict(extra="allow")

    instruction: str | None = None
    episode: EpisodeReport | None = None
    tools: list[dict[str, Any]] = Field(default_factory=list)
    text: str | None = None
    task: dict[str, Any] | None = None
    done: bool = False


@dataclass(frozen=True)
class _EpisodeBudget:
    """The stage budgets of the task an episode runs (as a rollout's, with the default server settings)."""

    stages: Budget
    command_s: float


def _episode_budget(arguments: dict[str, Any]) -> _EpisodeBudget | None:
    """The budget of the task `reset`'s arguments carry; None for a bare reset or a task the client cannot see
    (one of the server's set), or arguments the server will refuse anyway."""
    task = {key: value for key, value in arguments.items() if key not in _RESET_KEYS}
    if not is_task(task):
        return None
    try:
        request = parse_task(task)
    except TaskArgumentsError:
        return None
    return _EpisodeBudget(Budget.for_request(request, Settings()), request.command_timeout_s + STAGE_SLACK_S)


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
        self._budget: _EpisodeBudget | None = None

    async def connect(self) -> None:
        if self._ws is None:
            self._ws = await connect(self.url, open_timeout=self.connect_timeout_s, max_size=self.max_message_bytes,
                                     additional_headers=self._headers)

    async def reset(self, episode_id: str | None = None, **kwargs: Any) -> EpisodeStart:
        """Start a new episode (step count 0). With task fields (`instruction`, `files`, `setup`, `verify`, ...;
        upstream's `setup_scripts` / `verify_scripts`), or a task of the server's set (`split` and `index` or
        `seed`, or `task_id`), an interactive episode in a fresh sandbox: then `terminal`, `keystrokes` and
        finally `final_answer`. A task the server refuses raises `ServerError` (`EXECUTION_ERROR`)."""
        data = {**kwargs, **({"episode_id": episode_id} if episode_id is not None else {})}
        self._budget = _episode_budget(kwargs)
        wait = self._stage_wait(lambda budget: budget.stages.provision_s + budget.stages.setup_s)
        if not set(kwargs) - _RESET_KEYS:
            wait = self.reply_timeout_s
        reply = await self._ask({"type": "reset", "data": data}, wait)
        payload = reply["data"]
        return EpisodeStart.model_validate({**payload.get("observation", {}), "done": payload.get("done", False)})

    async def step(self, action: dict[str, Any], timeout_s: float | None = None) -> StepReply:
        """One raw `step`: `action` is OpenEnv's (`{"type": "list_tools"}`, or `{"type": "call_tool",
        "tool_name": ..., "arguments": {...}}`). Waits `timeout_s`, else the episode's deadline."""
        wait = timeout_s if timeout_s is not None else self._stage_wait(lambda budget: budget.stages.total_s)
        reply = await self._ask({"type": "step", "data": action}, wait)
        return StepReply.model_validate(reply["data"])

    async def list_tools(self) -> list[dict[str, Any]]:
        """The tools the session offers now (`{name, description, input_schema}`): `run_rollout`, and while an
        episode lives `terminal` and `keystrokes`."""
        reply = await self.step({"type": "list_tools"}, self.reply_timeout_s)
        return list(reply.observation.get("tools", []))

    async def terminal(self, command: str) -> TerminalResult:
        """Run one command in the episode's shell (cwd, variables and background jobs carry over); its output,
        exit code (null when it timed out) and `note`. `ToolCallError` when refused (no live episode, a bad
        command)."""
        data = await self._call("terminal", {"command": command, "final_answer": ""},
                                self._stage_wait(lambda budget: budget.command_s))
        return TerminalResult.model_validate(data)

    async def keystrokes(self, keys: str, duration: float = 1.0) -> TerminalResult:
        """Type `keys` into the episode's live shell (`\\n` submits a line, `C-c` alone interrupts), wait
        `duration` seconds, and return the output since the last call (no exit code)."""
        data = await self._call("keystrokes", {"keystrokes": keys, "duration": duration},
                                duration + self.reply_margin_s)
        return TerminalResult.model_validate(data)

    async def final_answer(self, answer: str = "done") -> EpisodeReport:
        """End the episode: the answer goes to `$FINAL_ANSWER_FILE`, the task is verified as a rollout is, and the
        report carries the `reward` (null when unscored) and `done`."""
        wait = self._stage_wait(lambda budget: budget.stages.verify_s + budget.stages.teardown_s)
        data = await self._call("terminal", {"command": "", "final_answer": answer}, wait)
        return EpisodeReport.model_validate(data)

    async def _call(self, tool: str, arguments: dict[str, Any], wait: float) -> dict[str, Any]:
        reply = await self.step({"type": "call_tool", "tool_name": tool, "arguments": arguments}, wait)
        error = reply.observation.get("error")
        if error:
            raise ToolCallError(error["error_type"], error["message"])
        return reply.observation["result"]["data"]

    def _stage_wait(self, stage: Callable[[_EpisodeBudget], float]) -> float:
        """A stage's budget for the episode's task plus the margin; the episode's deadline for an unseen task."""
        if self._budget is None:
            return Settings().episode_timeout_s + self.reply_margin_s
        return max(self.reply_timeout_s, stage(self._budget) + self.reply_margin_s)

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

    def reset(self, episode_id: str | None = None, **kwargs: Any) -> EpisodeStart:
        return self._run(self.client.reset(episode_id, **kwargs))

    def step(self, action: dict[str, Any], timeout_s: float | None = None) -> StepReply:
        return self._run(self.client.step(action, timeout_s))

    def list_tools(self) -> list[dict[str, Any]]:
        return self._run(self.client.list_tools())

    def terminal(self, command: str) -> TerminalResult:
        return self._run(self.client.terminal(command))

    def keystrokes(self, keys: str, duration: float = 1.0) -> TerminalResult:
        return self._run(self.client.keystrokes(keys, duration))

    def final_answer(self, answer: str = "done") -> EpisodeReport:
        return self._run(self.client.final_answer(answer))

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
