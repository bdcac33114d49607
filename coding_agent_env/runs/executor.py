"""Where a batch's rollouts run: in this process (the pipeline, with the sandbox backends built once), or on a
running server over the WebSocket client trainers use (one connection, so one session slot, per worker)."""

from __future__ import annotations

import abc
import asyncio
from contextlib import AsyncExitStack
from typing import Any

from coding_agent_env.client import CodingAgentEnv, ToolCallError
from coding_agent_env.errors import RequestError
from coding_agent_env.models import RolloutRequest, RolloutResult
from coding_agent_env.rollout import run_rollout
from coding_agent_env.sandbox.registry import Backends
from coding_agent_env.settings import Settings
from coding_agent_env.tasks import LoadedTask

__all__ = ["Executor", "InProcessExecutor", "Refused", "ServerExecutor"]


class Refused(Exception):
    """The task cannot run here as asked (the backend, the agent or a limit refused it before anything ran):
    reported as such, not as a rollout of the agent."""


class Executor(abc.ABC):
    """Runs one rollout of a task; `worker` is the calling worker's index (0..concurrency-1)."""

    async def __aenter__(self) -> Executor:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    @abc.abstractmethod
    async def run(self, task: LoadedTask, request: RolloutRequest, worker: int) -> RolloutResult:
        """The rollout's result; `Refused` when it could not start."""


class InProcessExecutor(Executor):
    """The rollout pipeline in this process; Harbor environments built into images for Docker (once per
    content hash)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._stack = AsyncExitStack()
        self._backends: Backends | None = None
        self._builds: dict[str, asyncio.Future[None]] = {}

    async def __aenter__(self) -> InProcessExecutor:
        self._backends = await self._stack.enter_async_context(Backends(self.settings))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def run(self, task: LoadedTask, request: RolloutRequest, worker: int) -> RolloutResult:
        assert self._backends is not None, "use as an async context manager"
        try:
            if task.environment is not None and self._backends.resolve(request.sandbox) == "docker":
                await self._image(task)
                request = request.model_copy(update={"image": task.environment.tag})
            return await run_rollout(request, settings=self.settings, backends=self._backends)
        except RequestError as exc:
            raise Refused(str(exc)) from exc

    async def _image(self, task: LoadedTask) -> None:
        """Build the task's image once; concurrent rollouts of the same environment wait for the one build."""
        assert task.environment is not None and self._backends is not None
        tag = task.environment.tag
        if tag not in self._builds:
            backend: Any = self._backends.get("docker")
            self._builds[tag] = asyncio.ensure_future(backend.build_image(str(task.environment.context), tag))
        try:
            await asyncio.shield(self._builds[tag])
        except Exception as exc:
            raise Refused(f"cannot build its Docker image: {exc}") from exc


class ServerExecutor(Executor):
    """Rollouts on a running server, one WebSocket session per worker (each holds one of the server's slots)."""

    def __init__(self, url: str, concurrency: int) -> None:
        self.url = url
        self._clients: list[CodingAgentEnv | None] = [None] * concurrency

    async def __aexit__(self, *exc: object) -> None:
        for client in self._clients:
            if client is not None:
                await client.close()

    async def run(self, task: LoadedTask, request: RolloutRequest, worker: int) -> RolloutResult:
        if task.environment is not None and request.sandbox == "docker":
            raise Refused("a Harbor task's Docker image is built in-process only; run without --server")
        client = self._clients[worker]
        if client is None:
            client = self._clients[worker] = CodingAgentEnv(self.url)
            await client.connect()
            await client.reset()
        try:
            return await client.run_rollout(request)
        except ToolCallError as exc:
            raise Refused(str(exc)) from exc
