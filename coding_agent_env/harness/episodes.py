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
Each WebSocket exchange has a deadline (`message_timeout_s`); a dropped connection is a `HarnessError`
(`channel.py` says which: unreachable, lost, refused).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from coding_agent_env.harness.channel import Channel, HarnessError, reply_data
from coding_agent_env.harness.servers import ServerPool

__all__ = ["EpisodeSession", "EpisodeSessionFactory", "HarnessError", "HarnessTool", "ToolResult", "VerifyResult",
           "reply_data"]

TERMINAL = "terminal"
RESERVED_TOOL_NAMES = frozenset({"reset", "step", "state", "close"})


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
        base_url: str | Sequence[str],
        *,
        defaults: Mapping[str, Any] | None = None,
        message_timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
    ) -> None:
        """`base_url`: the server, or several (a list, or comma-separated): each session opens on the one with the
        fewest sessions of this process (`ServerPool.shared`) and stays there; an unreachable one is skipped.
        `defaults`: task arguments every episode gets unless its task gives them (e.g. `sandbox`).
        `message_timeout_s` bounds each exchange: above the longest setup, command and verify."""
        self.servers = ServerPool.shared(base_url)
        self.base_url = ",".join(self.servers.urls)
        self.defaults = dict(defaults or {})
        self.message_timeout_s = message_timeout_s
        self.connect_timeout_s = connect_timeout_s

    def create(self, task: Any, seed: int | None = None, episode_id: str | None = None) -> EpisodeSession:
        return EpisodeSession(self, self.reset_arguments(task, seed, episode_id))

    def reset_arguments(self, task: Any, seed: int | None = None, episode_id: str | None = None) -> dict[str, Any]:
        """`reset`'s keyword arguments for `task`: the factory's defaults, then the task's, then seed and id."""
        if not isinstance(task, Mapping):
            raise HarnessError("an episode's task is a mapping of reset keyword arguments (instruction, ...)")
        arguments = {**self.defaults, **task}
        if seed is not None:
            arguments["seed"] = seed
        if episode_id is not None:
            arguments["episode_id"] = episode_id
        return arguments

    def connect(self) -> Channel:
        """A new connection (one server session) to the least busy server (its `base_url`);
        `ServerUnreachableError` (`NoServerError` with several) when none can be made."""
        return self.servers.open(self._connect_to)[1]

    def _connect_to(self, url: str) -> Channel:
        return Channel(url, connect_timeout_s=self.connect_timeout_s, message_timeout_s=self.message_timeout_s,
                       on_closed=lambda: self.servers.release(url))


class EpisodeSession:
    """One interactive episode (openenv's `ResourceSession`); see the module docstring.

    With `channel`, the episode is started on that open connection, which the session does not own: its
    `close()` then leaves the connection open (the next `reset` on it, or its own close, ends the episode);
    `CodingEnvironment` runs its episodes one after another this way."""

    def __init__(self, factory: EpisodeSessionFactory, reset_arguments: dict[str, Any], *,
                 channel: Channel | None = None) -> None:
        self._owns_channel = channel is None
        self._closed = False
        self._channel = factory.connect() if channel is None else channel
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
    def server(self) -> str:
        """The server this episode runs on."""
        return self._channel.base_url

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
        """Ends the episode: sends `close` and drops the connection (the server tears the sandbox down); a
        session on a channel it does not own only stops taking calls. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._owns_channel:
            self._channel.close()

    def _ask(self, message: dict[str, Any], expect: str) -> dict[str, Any]:
        if self._closed:
            raise HarnessError("the session is closed")
        if self._channel.closed:
            self.close()
            raise HarnessError("the session is closed (its connection was closed)")
        try:
            return self._channel.ask(message, expect)
        finally:
            if self._channel.closed:  # dropped, timed out, or closed by the server: nothing more comes
                self.close()
