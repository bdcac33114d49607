"""Where a batch's rollouts run: in this process (the pipeline, with the sandbox backends built once), or on
running servers over the WebSocket client trainers use (one connection, so one session slot, per worker; with
several servers the workers spread across them).

`Executor.run` gives a result or raises `Refused` (nothing ran: the request was refused, or the sandbox backend
could not honour what the task declares, which a result says as `refusal_of` reads it). Anything else it raises is
a failure of ours inside that one rollout: the batch turns it into that rollout's result with `failed_result`
(status infra_error, the error typed) and goes on with the others.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
from websockets.exceptions import InvalidStatus, WebSocketException

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
from coding_agent_env.urls import IMAGES_PATH, caller_headers, http_url

__all__ = [
    "Executor", "InProcessExecutor", "Refused", "ServerExecutor", "ServerUnreachableError", "failed_result",
    "refusal_of",
]

log = logging.getLogger(__name__)

MAX_ERROR_CHARS = 2000
"""Characters kept of an unexpected error's message."""


class Refused(Exception):
    """The task cannot run here as asked (the backend, the agent or a limit refused it before anything ran):
    reported as such, not as a rollout of the agent."""


class ServerUnreachableError(Exception):
    """No server of the batch could be reached for a rollout (connection refused, unresolvable, the handshake
    timed out): the message names each server and why. That rollout fails with it; nothing ran."""


REFUSED_ERROR_TYPE = "SandboxUnsupportedError"
"""The error type of a result whose sandbox backend could not honour what the task declares (its workdir, users,
hidden tests at /tests, claimed directories): `errors.SandboxUnsupportedError`, raised before anything ran."""


def refusal_of(result: RolloutResult) -> str | None:
    """Why the task never ran, when `result` says its backend refused it at provisioning (status infra_error,
    reward null, nothing of the task's ran), else None. Such a task is counted as refused, never as a rollout:
    it is refused again on every attempt, and a run with one exits 1."""
    detail = result.error_detail
    if result.status != RolloutStatus.INFRA_ERROR or detail is None:
        return None
    if detail.type != REFUSED_ERROR_TYPE or detail.stage != "provision" or result.setup_results:
        return None
    return detail.message


def _refuse_if_refused(result: RolloutResult) -> RolloutResult:
    reason = refusal_of(result)
    if reason is not None:
        raise Refused(reason)
    return result


_DENIED = (401, 403)
"""Handshake statuses of a server that refuses this caller (no caller token, or the wrong one)."""


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
            return _refuse_if_refused(await run_rollout(request, settings=self.settings, backends=self._backends))
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
    """Rollouts on one or several running servers, one WebSocket session per worker (each holds one of its
    server's slots). Worker i works on server i mod n and keeps its connection while it works: the batch spreads
    evenly across the servers, and each rollout runs where its session is. A server that cannot be reached is
    reported once (`notice`) and left out: its workers spread over the others (it is tried again only when no
    other answers); a rollout with no server to run on fails with `ServerUnreachableError` naming each server's
    reason. A Harbor task whose environment needs an image has the rollout's server build it (`POST /images`,
    once per environment and server per batch; the server must allow builds: `IMAGE_BUILDS=true`). `ran` counts
    the results each server gave."""

    def __init__(self, urls: str | Sequence[str], concurrency: int, *,
                 notice: Callable[[str], None] = log.warning) -> None:
        self.urls = (urls,) if isinstance(urls, str) else tuple(urls)
        if not self.urls:
            raise ValueError("no server URL")
        self.ran: Counter[str] = Counter()
        self.unreachable: dict[str, str] = {}
        """Servers that could not be reached -> why (until one answers again)."""
        self._notice = notice
        self._clients: list[tuple[str, CodingAgentEnv] | None] = [None] * concurrency
        self._images: dict[tuple[str, str], asyncio.Future[str]] = {}

    async def __aexit__(self, *exc: object) -> None:
        for index, held in enumerate(self._clients):
            if held is not None:
                self._clients[index] = None
                await held[1].close()

    async def run(self, task: LoadedTask, request: RolloutRequest, worker: int) -> RolloutResult:
        url, client = await self._client(worker)
        try:
            if task.environment is not None:
                request = request.model_copy(update={"image": await self._image(url, task), "sandbox": "docker"})
            result = await client.run_rollout(request)
        except ToolCallError as exc:
            raise Refused(str(exc)) from exc
        except Refused:
            raise
        except BaseException:
            # The connection may be what failed: the next rollout of this worker connects afresh.
            self._clients[worker] = None
            await _close_quietly(client)
            raise
        self.ran[url] += 1
        return _refuse_if_refused(result)

    def _server(self, worker: int, tried: Mapping[str, str]) -> str | None:
        """The worker's server: its turn among those answering (else among those not tried for this rollout)."""
        candidates = ([url for url in self.urls if url not in tried and url not in self.unreachable]
                      or [url for url in self.urls if url not in tried])
        return candidates[worker % len(candidates)] if candidates else None

    async def _client(self, worker: int) -> tuple[str, CodingAgentEnv]:
        """The worker's open session, else a new one on its server, else on the next that answers."""
        held = self._clients[worker]
        if held is not None:
            return held
        tried: dict[str, str] = {}
        denied: dict[str, str] = {}
        while (url := self._server(worker, tried)) is not None:
            client = CodingAgentEnv(url)
            try:
                await client.connect()
                await client.reset()
            except InvalidStatus as exc:
                await _close_quietly(client)
                tried[url] = f"cannot connect: {type(exc).__name__}: {exc}"
                if exc.response.status_code in _DENIED:
                    tried[url] = denied[url] = (
                        f"server {url} refused this caller ({exc.response.status_code}): set API_TOKEN to the "
                        "server's caller token")
                self._down(url, tried[url])
                continue
            except (OSError, WebSocketException, TimeoutError) as exc:
                await _close_quietly(client)
                tried[url] = f"cannot connect: {type(exc).__name__}: {exc}"
                self._down(url, tried[url])
                continue
            except BaseException:
                await _close_quietly(client)
                raise
            self.unreachable.pop(url, None)
            self._clients[worker] = (url, client)
            return url, client
        if denied and len(denied) == len(tried):  # every server answered, refusing this caller: nothing can run
            raise Refused("; ".join(denied.values()))
        raise ServerUnreachableError("; ".join(f"server {url}: {tried[url]}" for url in self.urls))

    def _down(self, url: str, reason: str) -> None:
        """Leave `url` out of the next connections; say so the first time (the other servers go on)."""
        if url not in self.unreachable and len(self.urls) > 1:
            self._notice(f"server {url} is unreachable ({reason}): its rollouts go to the other servers")
        self.unreachable[url] = reason

    def report(self) -> list[str]:
        """With several servers, one line: the results each gave, and which could not be reached."""
        if len(self.urls) == 1:
            return []
        parts = [f"{url} {self.ran[url]}" + (" (unreachable)" if url in self.unreachable else "")
                 for url in self.urls]
        return ["rollouts per server: " + ", ".join(parts)]

    async def _image(self, url: str, task: LoadedTask) -> str:
        """Server `url`'s name for the task's image, built there from the environment directory sent to it."""
        assert task.environment is not None
        key = (url, task.environment.tag)
        if key not in self._images:
            self._images[key] = asyncio.ensure_future(self._build(url, task.environment.context))
        try:
            return await asyncio.shield(self._images[key])
        except Refused:
            raise
        except Exception as exc:
            raise Refused(f"the server could not build its Docker image: {exc}") from exc

    async def _build(self, url: str, context: Path) -> str:
        body = await asyncio.to_thread(pack, context)
        # A build may take minutes: no read deadline beyond the server's own build.
        timeout = httpx.Timeout(30.0, read=None)
        async with httpx.AsyncClient(base_url=http_url(url), timeout=timeout) as http:
            answer = await http.post(IMAGES_PATH, content=body,
                                     headers={"Content-Type": "application/x-tar", **caller_headers()})
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
