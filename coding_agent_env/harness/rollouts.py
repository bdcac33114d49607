"""`RolloutSessionFactory` / `RolloutSession`: loop-owning sessions for trainers, OpenEnv's harness contract
(openenv 0.10 `openenv.core.harness`: `ResourceSessionFactory`, `LoopOwningSession`, `TrainableSession`) served by
whole rollouts: a CLI agent owns its loop, the relay records every call, and the trainer reads the trace back.

    factory = RolloutSessionFactory("http://127.0.0.1:8000", defaults={"agent": "opencode", "endpoint": "vllm",
                                                                        "mode": "transparent_proxy"})
    session = factory.create(task={"instruction": ..., "verify": [...]})   # the rollout starts now
    exit_code = session.wait_for_completion(timeout_s=900)
    entries = session.fetch_proxy_trace()        # TraceEntry dicts, one per LLM call
    trace = session.fetch_training_trace()       # openenv's TrainingTrace (validated), or its dict
    reward = session.verify([]).env_reward       # None when the rollout was not scored
    session.close()

Contract:
- `create(task, seed=None, episode_id=None)` starts one rollout in the background and returns at once: over a
  server's WebSocket (`base_url`), or in-process (`settings`, no server). The task is a mapping of
  `RolloutRequest` fields (the factory's `defaults` first) or a `RolloutRequest`; a task that is not a valid
  request is a `HarnessError` at once and nothing starts. `seed` and `episode_id` are kept in the trace's
  metadata.
- `wait_for_completion(timeout_s=None)` blocks until the rollout ended and returns the agent's exit code: -1 when
  the agent never ran or never exited by itself (setup failure, infra error, timeout, cancellation: `result`
  says which). At `timeout_s` it raises `TimeoutError` and the rollout goes on (`close()` ends it). A
  connection that failed, or a request the server refused, is a `HarnessError`.
- `fetch_proxy_trace()` -> `TraceEntry` dicts (`request` with the whole messages and tools, `response` with
  choice 0, `prompt_token_ids`, `completion_token_ids`, `completion_tokens`, `per_token_logps`, `loss_mask`,
  `reward`, `metadata` with `node_id`, purpose, trainability), one per call in order; `fetch_training_trace()`
  -> the rollout's training trace: openenv's `TrainingTrace` when openenv is importable, else the dict it
  validates (an empty trace when the upstream returned no token ids). Both wait for the rollout to end.
- `verify(transcript=None, final_state=None)` -> `VerifyResult` forwarding the rollout's reward (`None` when not
  scored: an infra failure, a setup failure, a cancellation), never computing one.
- `close()` ends the session: a rollout still running is cancelled (the server tears its sandbox down), and its
  thread joined. Idempotent.
Standard library, `websockets` and the package's models only: it imports where trainers are (openenv 0.10 and
TRL pin `mcp` below 2; the server's own dependencies are not needed for the WebSocket path).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from typing import Any

from pydantic import ValidationError
from websockets.exceptions import WebSocketException
from websockets.sync.client import ClientConnection, connect

from coding_agent_env.harness.channel import ServerUnreachableError
from coding_agent_env.harness.episodes import HarnessError, VerifyResult, reply_data
from coding_agent_env.harness.servers import ServerPool
from coding_agent_env.llm.trace import trace_entries
from coding_agent_env.models import RolloutRequest, RolloutResult, RolloutStatus, validation_summary
from coding_agent_env.settings import Settings
from coding_agent_env.urls import caller_headers, ws_url

__all__ = ["RolloutSession", "RolloutSessionFactory"]

_MAX_FRAME_BYTES = 256 * 1024 * 1024
_NOT_SCORED = (RolloutStatus.INFRA_ERROR, RolloutStatus.SETUP_FAILED, RolloutStatus.CANCELLED)


class RolloutSessionFactory:
    """Makes one `RolloutSession` per rollout (openenv's `ResourceSessionFactory.create`)."""

    def __init__(
        self,
        base_url: str | Sequence[str] | None = None,
        *,
        defaults: Mapping[str, Any] | None = None,
        settings: Settings | None = None,
        connect_timeout_s: float = 10.0,
    ) -> None:
        """`base_url`: a coding-agent-env server, or several (a list, or comma-separated: each rollout runs on the
        one with the fewest of this process's rollouts, an unreachable one skipped); None: rollouts run in this
        process with `settings` (default: from the environment). `defaults`: request fields every task gets
        unless it gives them."""
        self.servers = None if base_url is None else ServerPool.shared(base_url)
        self.base_url = None if self.servers is None else ",".join(self.servers.urls)
        self.defaults = dict(defaults or {})
        self.settings = settings
        self.connect_timeout_s = connect_timeout_s

    def create(self, task: Any, seed: int | None = None, episode_id: str | None = None) -> RolloutSession:
        if isinstance(task, RolloutRequest):
            fields = {**self.defaults, **task.model_dump(exclude_unset=True)}
            if task.api_key is not None:
                fields["api_key"] = task.api_key
        elif isinstance(task, Mapping):
            fields = {**self.defaults, **task}
        else:
            raise HarnessError("a rollout's task is a RolloutRequest or a mapping of its fields")
        try:
            request = RolloutRequest.model_validate(fields)
        except ValidationError as exc:
            raise HarnessError(f"not a rollout request: {validation_summary(exc)}") from None
        return RolloutSession(self, request, {"seed": seed, "episode_id": episode_id})


class RolloutSession:
    """One rollout running in the background; see the module docstring."""

    def __init__(self, factory: RolloutSessionFactory, request: RolloutRequest, metadata: dict[str, Any]) -> None:
        self.request = request
        self.metadata = metadata
        self._factory = factory
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._closed = False
        self._result: RolloutResult | None = None
        self._failure: HarnessError | None = None
        self._ws: ClientConnection | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[RolloutResult] | None = None
        self.server: str | None = None
        """The server the rollout runs on (None: in this process)."""
        target = self._over_ws if factory.base_url is not None else self._in_process
        if factory.base_url is not None:
            self._connect()  # a server that cannot be reached fails create(), not a later wait
        self._thread = threading.Thread(target=target, name="rollout-session", daemon=True)
        self._thread.start()

    # -- the protocols -------------------------------------------------------------------------------------

    def wait_for_completion(self, timeout_s: float | None = None) -> int:
        result = self._wait(timeout_s)
        return result.agent_exit_code if result.agent_exit_code is not None else -1

    def fetch_proxy_trace(self) -> list[dict[str, Any]]:
        result = self._wait(None)
        entries = trace_entries(result.proxy_turns, result.training, result.training.reward
                                if result.training is not None else result.reward)
        for entry in entries:
            entry["metadata"] = {**entry["metadata"], **{k: v for k, v in self.metadata.items() if v is not None},
                                 "rollout_id": result.rollout_id, "task_id": result.task_id, "agent": result.agent}
        return entries

    def fetch_training_trace(self) -> Any:
        result = self._wait(None)
        trace = result.training.trace if result.training is not None else {"schema_version": 1, "turns": []}
        try:
            from openenv.core.harness.training import TrainingTrace
        except ImportError:
            return trace
        return TrainingTrace.model_validate(trace)

    def verify(self, transcript: list[dict[str, Any]] | None = None, final_state: Any | None = None) -> VerifyResult:
        result = self._wait(None)
        reward = None if result.status in _NOT_SCORED else result.reward
        metrics = {"status": result.status.value, "turns": len(result.proxy_turns), "wall_s": result.wall_s}
        return VerifyResult(env_reward=reward, done=True, metrics=metrics,
                            artifacts={"rollout_id": result.rollout_id, "error": result.error})

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if not self._done.is_set():
            self._cancel()
        self._thread.join()

    # -- beyond the protocols ------------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def result(self) -> RolloutResult:
        """The rollout's result (waits for it)."""
        return self._wait(None)

    # -- running ---------------------------------------------------------------------------------------------

    def _wait(self, timeout_s: float | None) -> RolloutResult:
        if not self._done.wait(timeout_s):
            raise TimeoutError(f"the rollout did not end within {timeout_s} s (it goes on; close() ends it)")
        if self._failure is not None:
            raise self._failure
        assert self._result is not None
        return self._result

    def _connect(self) -> None:
        """Open the rollout's connection on the least busy server (`ServerUnreachableError` when none answers)."""
        assert self._factory.servers is not None
        self._exit = ExitStack()
        self.server, self._ws = self._factory.servers.open(self._connect_to)

    def _connect_to(self, url: str) -> ClientConnection:
        try:
            return self._exit.enter_context(connect(
                ws_url(url), open_timeout=self._factory.connect_timeout_s, max_size=_MAX_FRAME_BYTES,
                compression=None, additional_headers=caller_headers(),
            ))
        except (OSError, WebSocketException, TimeoutError) as exc:
            raise ServerUnreachableError(f"cannot connect to {url}: {exc}") from exc

    def _over_ws(self) -> None:
        assert self._ws is not None
        arguments = self.request.model_dump(mode="json", exclude_unset=True)
        if self.request.api_key is not None:
            arguments["api_key"] = self.request.api_key.get_secret_value()
        action = {"type": "call_tool", "tool_name": "run_rollout", "arguments": arguments}
        try:
            self._ws.send(json.dumps({"type": "reset", "data": {}}))
            reply_data(json.loads(self._ws.recv()), "observation")
            self._ws.send(json.dumps({"type": "step", "data": action}))
            reply = reply_data(json.loads(self._ws.recv()), "observation")
            observation = reply.get("observation") or {}
            if observation.get("error"):
                error = observation["error"]
                raise HarnessError(f"{error.get('error_type', 'error')}: {error.get('message', '')}")
            self._result = RolloutResult.model_validate((observation.get("result") or {}).get("data"))
        except HarnessError as exc:
            self._failure = exc
        except (OSError, WebSocketException, ValueError, ValidationError) as exc:
            why = "cancelled by close()" if self._closed else f"{type(exc).__name__}: {exc}"
            self._failure = HarnessError(f"the rollout's connection failed: {why}")
        finally:
            self._exit.close()
            if self._factory.servers is not None and self.server is not None:
                self._factory.servers.release(self.server)
            self._done.set()

    def _in_process(self) -> None:
        from coding_agent_env.errors import RequestError
        from coding_agent_env.rollout import run_rollout

        async def run() -> RolloutResult:
            self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()  # type: ignore[assignment]
            if self._closed:  # close() came before there was a task to cancel
                raise asyncio.CancelledError
            return await run_rollout(self.request, settings=self._factory.settings or Settings.from_env())

        try:
            with asyncio.Runner() as runner:
                self._result = runner.run(run())
        except asyncio.CancelledError:
            self._failure = HarnessError("the rollout was cancelled by close()")
        except RequestError as exc:
            self._failure = HarnessError(f"the request was refused: {exc}")
        finally:
            self._done.set()

    def _cancel(self) -> None:
        if self._ws is not None:
            try:
                self._ws.close()  # the server cancels the rollout and tears its sandbox down
            except (OSError, WebSocketException):
                pass
        elif self._loop is not None and self._task is not None:
            try:
                self._loop.call_soon_threadsafe(self._task.cancel)
            except RuntimeError:
                pass  # the loop already closed: the rollout ended meanwhile
