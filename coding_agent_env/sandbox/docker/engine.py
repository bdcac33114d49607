"""The Docker SDK's edge: its blocking calls run in threads, and the one place its errors become ours."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

import docker.errors
import requests.exceptions

from coding_agent_env.errors import SandboxError, SandboxFileNotFoundError, SandboxUnavailableError

__all__ = ["SDK_ERRORS", "call", "close_attach_socket", "translate"]

T = TypeVar("T")

SDK_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException)


def translate(exc: Exception, what: str) -> SandboxError:
    """The one place Docker SDK and transport errors become our typed errors."""
    if isinstance(exc, docker.errors.ImageNotFound):
        return SandboxUnavailableError(f"{what}: image not found on the Docker daemon")
    if isinstance(exc, docker.errors.NotFound):
        return SandboxFileNotFoundError(f"{what}: not found")
    if isinstance(exc, requests.exceptions.ConnectionError | docker.errors.DockerException) and not isinstance(
        exc, docker.errors.APIError
    ):
        return SandboxUnavailableError(f"{what}: Docker daemon unreachable ({type(exc).__name__})")
    detail = exc.explanation if isinstance(exc, docker.errors.APIError) else str(exc)
    return SandboxError(f"{what}: {detail}")


async def call(what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` in a worker thread, its SDK errors translated."""
    try:
        return await asyncio.to_thread(fn, *args, **kwargs)
    except SDK_ERRORS as exc:
        raise translate(exc, what) from exc


def close_attach_socket(sock: Any) -> None:
    """Close an exec attach socket for real. The SDK returns the `SocketIO` of an upgraded HTTP connection,
    whose close() leaves the socket itself open (a ResourceWarning later); docker>=7,<8 is pinned for this."""
    response = getattr(sock, "_response", None)
    if response is not None:
        response.close()
    raw = getattr(sock, "_sock", None)
    sock.close()
    if raw is not None:
        raw.close()
