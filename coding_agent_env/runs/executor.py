"""Where a batch's rollouts run: in this process (the pipeline, with the sandbox backends built once), or on a
running server over the WebSocket client trainers use (one connection, so one session slot, per worker).

`Executor.run` gives a result or raises `Refused` (nothing ran). Anything else it raises is a failure of ours
inside that one rollout: the batch turns it into that rollout's result with `failed_result` (status infra_error,
the error typed) and goes on with the others.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import uuid
from contextlib import AsyncExitStack
from pathlib import Path

import httpx

from coding_agent_env.client import CodingAgentEnv, ToolCallError
from coding_agent_env.errors import RequestError
from coding_agent_env.models import ErrorInfo, RolloutRequest, RolloutResult, RolloutStatus
from coding_agent_env.rollout import run_rollout
from coding_agent_env.workspace.redact import Redactor
from coding_agent_env.runs.images import ImageBuilds
from coding_agent_env.sandbox.registry import Backends
from coding_agent_env.settings import Settings
from coding_agent_env.tasks import LoadedTask
from coding_agent_env.tasks.context import pack
from coding_agent_env.urls import IMAGES_PATH, http_url

__all__ = ["Executor", "InProcessExecutor", "Refused", "ServerExecutor", "failed_result"]

log = logging.getLogger(__name__)

MAX_ERROR_CHARS = 2000
"""Characters kept of an unexpected error's message."""


class Refused(Exception):
    """The task cannot run here as asked (the backend, the agent or a limit refused it before anything ran):
    reported as such, not as a rollout of the agent."""


def failed_result(request: RolloutRequest, exc: BaseException, *, sandbox: str = "") -> RolloutResult:
    """The result of a rollout that raised `exc` instead of giving one: infra_error, reward null, the error typed
    (its class name) with its message bounded and without the request's key."""
    kind = type(exc).__name__
    redact = Redactor([request.api_key.get_secret_value() if request.api_key else None])
    message = redact.text((str(exc) or kind)[:MAX_ERROR_CHARS])
    error = ErrorInfo(type=kind, stage="rollout", message=message)
    return RolloutResult(
        rollout_id=uuid.uuid4().hex,
        task_id=redact.text(request.task_id or ""),
        agent=request.agent or "",
        sandbox=request.sandbox or sandbox,
        mode=request.mode,
        status=RolloutStatus.INFRA_ERROR,
        reward=None,
        error=error.line(),
        error_detail=error,
    )


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
        self._images: ImageBuilds | None = None
        self._failed: dict[str, str] = {}
        """Tags whose build failed in this batch: their other rollouts are refused without building again."""

    async def __aenter__(self) -> InProcessExecutor:
        self._backends = await self._stack.enter_async_context(Backends(self.settings))
        self._images = ImageBuilds(self._backends)
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
        assert task.environment is not None and self._images is not None
        tag = task.environment.tag
        if tag not in self._failed:
            try:
                await self._images.ensure(task.environment.context, tag)
                return
            except Exception as exc:
                self._failed[tag] = str(exc)
        raise Refused(f"cannot build its Docker image: {self._failed[tag]}")


class ServerExecutor(Executor):
    """Rollouts on a running server, one WebSocket session per worker (each holds one of the server's slots). A
    Harbor task whose environment needs an image has the server build it (`POST /images`, once per environment
    per batch; the server must allow builds: `IMAGE_BUILDS=true`)."""

    def __init__(self, url: str, concurrency: int) -> None:
        self.url = url
        self._clients: list[CodingAgentEnv | None] = [None] * concurrency
        self._images: dict[str, asyncio.Future[str]] = {}

    async def __aexit__(self, *exc: object) -> None:
        for client in self._clients:
            if client is not None:
                await client.close()

    async def run(self, task: LoadedTask, request: RolloutRequest, worker: int) -> RolloutResult:
        if task.environment is not None:
            request = request.model_copy(update={"image": await self._image(task), "sandbox": "docker"})
        client = self._clients[worker]
        if client is None:
            client = self._clients[worker] = CodingAgentEnv(self.url)
            await client.connect()
            await client.reset()
        try:
            return await client.run_rollout(request)
        except ToolCallError as exc:
            raise Refused(str(exc)) from exc
        except BaseException:
            # The connection may be what failed: the next rollout of this worker connects afresh.
            self._clients[worker] = None
            await _close_quietly(client)
            raise

    async def _image(self, task: LoadedTask) -> str:
        """The server's name for the task's image, built there from the environment directory sent to it."""
        assert task.environment is not None
        tag = task.environment.tag
        if tag not in self._images:
            self._images[tag] = asyncio.ensure_future(self._build(task.environment.context))
        try:
            return await asyncio.shield(self._images[tag])
        except Refused:
            raise
        except Exception as exc:
            raise Refused(f"the server could not build its Docker image: {exc}") from exc

    async def _build(self, context: Path) -> str:
        body = await asyncio.to_thread(pack, context)
        # A build may take minutes: no read deadline beyond the server's own build.
        timeout = httpx.Timeout(30.0, read=None)
        async with httpx.AsyncClient(base_url=http_url(self.url), timeout=timeout) as http:
            answer = await http.post(IMAGES_PATH, content=body, headers={"Content-Type": "application/x-tar"})
        if answer.status_code != 200:
            try:
                message = answer.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = answer.text[:300]
            raise Refused(f"the server refused to build its Docker image ({answer.status_code}): {message}")
        return str(answer.json()["image"])


async def _close_quietly(client: CodingAgentEnv) -> None:
    try:
        await asyncio.shield(client.close())
    except Exception as exc:  # noqa: BLE001 - already failing: the rollout's own error is what is reported
        log.warning("closing a failed connection to the server: %r", exc)
