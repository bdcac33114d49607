"""`EpisodeSessionFactory` / `EpisodeSession`: OpenEnv's `ResourceSessionFactory` / `ResourceSession` shapes
(openenv 0.10 `openenv.core.harness`), each session one interactive episode on a coding-agent-env server.

    factory = EpisodeSessionFactory("http://127.0.0.1:8000")
    session = factory.create(task={"instruction": ..., "setup_scripts": ..., "verify_scripts": ...})
    result = MCPHarnessAdapter().run_white_box(model_step, session)   # the trainer samples every token
    reward = session.verify(result.messages).env_reward                # None when never scored
    session.close()

Contract (what openenv's white-box loop relies on):
- `create(task, seed=None, episode_id=None)` opens a WebSocket (`/ws`) and resets it with the task's keyword
  arguments (the factory's `defaults` first); an error frame (a bad task, capacity) is a `HarnessError` and
  nothing stays open. A task whose setup failed gives a session that is already done.
- `initial_messages()`: one user message, the instruction and how setup went.
- `list_tools()`: the `terminal` tool (objects with `name`, `description`, `input_schema`).
- `call_tool(name, arguments)`: a `ToolResult` whose `data` is the text the model reads (a command's output
  and exit code; for a final answer, the outcome: passed/total and the reward), `done` once the episode ended,
  and `metadata` the structured result (`reward` only on the final answer: openenv reads the episode's reward
  from there). A refused call (bad arguments, after done) is a `ToolResult` with `error` set and the message
  as its data: the model sees it and may correct itself. Unknown or reserved tool names raise `KeyError`, as
  openenv's own sessions do.
- `verify(transcript, final_state=None)`: forwards the reward the environment computed (`None` when the
  episode was never scored); it computes nothing itself.
- `close()`: ends the episode (the server tears its sandbox down); idempotent.
Each WebSocket exchange has a deadline (`message_timeout_s`); a dropped connection is a `HarnessError`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from websockets.exceptions import WebSocketException
from websockets.sync.client import ClientConnection, connect

from coding_agent_env.errors import CodingAgentEnvError
from coding_agent_env.urls import ws_url

__all__ = ["EpisodeSession", "EpisodeSessionFactory", "HarnessError", "HarnessTool", "ToolResult", "VerifyResult"]

TERMINAL = "terminal"
RESERVED_TOOL_NAMES = frozenset({"reset", "step", "state", "close"})
_MAX_FRAME_BYTES = 100 * 1024 * 1024


class HarnessError(CodingAgentEnvError):
    """The server refused the episode, or the connection to it failed."""


@dataclass(frozen=True)
class HarnessTool:
    """A tool as openenv's `Tool` describes one."""

    name: str
    description: str
    input_schema: dict[str, Any]


@dataclass
class ToolResult:
    """openenv's `ToolResult` fields."""

    data: Any = None
    done: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


@dataclass
class VerifyResult:
    """openenv's `VerifyResult` fields; `env_reward` is the environment's own reward, forwarded."""

    env_reward: float | None = None
    done: bool = False
    metrics: dict[str, Any] = field(default_factory=dict)
    artifacts: dict[str, Any] = field(default_factory=dict)


class EpisodeSessionFactory:
    """Makes one `EpisodeSession` per rollout (openenv's `ResourceSessionFactory.create`)."""

    def __init__(
        self,
        base_url: str,
        *,
        defaults: Mapping[str, Any] | None = None,
        message_timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
    ) -> None:
        """`defaults`: task arguments every episode gets unless its task gives them (e.g. `sandbox`).
        `message_timeout_s` bounds each exchange: above the longest setup, command and verify."""
        self.base_url = base_url
        self.defaults = dict(defaults or {})
        self.message_timeout_s = message_timeout_s
        self.connect_timeout_s = connect_timeout_s

    def create(self, task: Any, seed: int | None = None, episode_id: str | None = None) -> EpisodeSession:
        if not isinstance(task, Mapping):
            raise HarnessError("an episode's task is a mapping of reset keyword arguments (instruction, ...)")
        arguments = {**self.defaults, **task}
        if seed is not None:
            arguments["seed"] = seed
        if episode_id is not None:
            arguments["episode_id"] = episode_id
        return EpisodeSession(self, arguments)


class EpisodeSession:
    """One interactive episode (openenv's `ResourceSession`); see the module docstring."""

    def __init__(self, factory: EpisodeSessionFactory, reset_arguments: dict[str, Any]) -> None:
        self._timeout_s = factory.message_timeout_s
        self._closed = False
        self._exit = ExitStack()  # the connection is a context (websockets wants one); close() exits it
        try:
            self._ws: ClientConnection = self._exit.enter_context(connect(
                ws_url(factory.base_url), open_timeout=factory.connect_timeout_s, max_size=_MAX_FRAME_BYTES,
                compression=None,
            ))
        except (OSError, WebSocketException, TimeoutError) as exc:
            raise HarnessError(f"cannot connect to {factory.base_url}: {exc}") from exc
        try:
            opened = self._ask({"type": "reset", "data": reset_arguments}, "observation")
        except BaseException:
            self.close()
            raise
        observation = opened.get("observation") or {}
        self.episode: dict[str, Any] = observation.get("episode") or {}
        self.instruction: str = observation.get("text") or observation.get("instruction") or ""
        self.done: bool = bool(opened.get("done"))
        self.reward: float | None = None
        self._tools = [
            HarnessTool(tool["name"], tool.get("description", ""), tool.get("input_schema") or {})
            for tool in observation.get("tools") or [] if tool.get("name") == TERMINAL
        ]

    @property
    def episode_id(self) -> str | None:
        return self.episode.get("episode_id")

    def initial_messages(self) -> list[dict[str, Any]]:
        return [{"role": "user", "content": self.instruction}]

    def list_tools(self) -> list[HarnessTool]:
        return list(self._tools)

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        if name in RESERVED_TOOL_NAMES:
            raise KeyError(f"Reserved orchestration tool: {name}")
        if name != TERMINAL:
            raise KeyError(f"Unknown tool: {name}")
        action = {"type": "call_tool", "tool_name": name, "arguments": dict(arguments)}
        reply = self._ask({"type": "step", "data": action}, "observation")
        observation = reply.get("observation") or {}
        error = observation.get("error")
        if error:
            message = str(error.get("message", error))
            return ToolResult(data=message, done=self.done, metadata={"error_type": error.get("error_type")},
                              error=message)
        result = observation.get("result") or {}
        content = result.get("content") or [{}]
        data = result.get("data") or {}
        metadata: dict[str, Any] = {"result": data}
        if reply.get("done"):
            self.done, self.reward, self.episode = True, reply.get("reward"), data
            metadata["reward"] = self.reward
        return ToolResult(data=content[0].get("text", ""), done=self.done, metadata=metadata)

    def verify(self, transcript: list[dict[str, Any]], final_state: Any | None = None) -> VerifyResult:
        metrics = {"status": self.episode.get("status"), "steps": self.episode.get("step_count"),
                   "transcript_length": len(transcript)}
        return VerifyResult(env_reward=self.reward, done=self.done, metrics=metrics,
                            artifacts={"episode": dict(self.episode)})

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._ws.send(json.dumps({"type": "close"}))
        except (OSError, WebSocketException):
            pass  # already gone: the server ends the episode on disconnect too
        finally:
            self._exit.close()

    def _ask(self, message: dict[str, Any], expect: str) -> dict[str, Any]:
        if self._closed:
            raise HarnessError("the session is closed")
        try:
            self._ws.send(json.dumps(message))
            frame = json.loads(self._ws.recv(timeout=self._timeout_s))
        except (OSError, WebSocketException, TimeoutError, ValueError) as exc:
            # A late reply would be paired with the next request: the connection is done for (the server ends
            # the episode when it drops).
            self.close()
            raise HarnessError(f"the episode's connection failed: {type(exc).__name__}: {exc}") from exc
        return reply_data(frame, expect)


def reply_data(frame: dict[str, Any], kind: str) -> dict[str, Any]:
    """The data of a server frame of type `kind`; `HarnessError` for an error frame (its code and message) or a
    frame of another type."""
    if frame.get("type") == "error":
        data = frame.get("data") or {}
        raise HarnessError(f"{data.get('code', 'ERROR')}: {data.get('message', '')}")
    if frame.get("type") != kind:
        raise HarnessError(f"unexpected reply: {str(frame.get('type'))[:50]}")
    return frame.get("data") or {}
