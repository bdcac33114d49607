"""`POST /images`: build a task's Docker image from a build context the client sends, so a batch running through
this server (`coding-agent-env run --server`) can run Harbor tasks whose environment needs an image.

The body is the context as a tar archive (gzipped or not; `tasks.context.pack`), at most `IMAGE_BUILD_MAX_MB`
sent and unpacked. The server unpacks it as a stream, in a worker thread, into a private directory (no links,
devices or paths leaving it), refusing it the moment it crosses a cap on the unpacked size, the entry count or the
compression ratio (`tasks.context.UnpackCaps`: a gzip bomb costs what the caps allow, not what it holds); names
the image by the content hash it computes itself (`coding-agent-env-task:<hash>`, the name the client computes
too), builds it with the Docker backend unless it exists (one build per tag at a time), removes the directory,
and answers `{"image": TAG, "built": bool, "mapped": [...]}`; a rollout then names that image. The server's
image map (`IMAGE_MAP`; `tasks.images`) rewrites the Dockerfile's base images in the unpacked copy before it is
hashed (so the tag names the mapped build), each rewrite listed in `mapped`. Refusals, each with a message:
403 when the operator has not enabled builds (`IMAGE_BUILDS=true`), 409 without a Docker backend, 413 for a
context over a cap (sent or unpacked size, entries, compression ratio), 400 for an archive that is not a clean
build context or has no Dockerfile, 422 when the build fails (the engine's last lines). With the server's metrics
each request is counted by its outcome (`coding_agent_env_image_build_requests_total`): `built`, `present` (the
image existed), or the refusal's (`_REFUSALS`), `error` for one that raised.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse

from coding_agent_env.errors import SandboxError, UnknownBackendError
from coding_agent_env.observe.metrics import ServerMetrics
from coding_agent_env.runs.images import ImageBuilds
from coding_agent_env.sandbox.registry import Backends
from coding_agent_env.settings import Settings
from coding_agent_env.tasks.context import (
    ContextError,
    ContextTooLargeError,
    UnpackCaps,
    content_hash,
    image_tag,
    unpack,
)
from coding_agent_env.tasks.images import rewrite_from
from coding_agent_env.urls import IMAGES_PATH

__all__ = ["IMAGES_PATH", "ImageBuildRoute"]

log = logging.getLogger(__name__)

_REFUSALS = {403: "disabled", 409: "no_docker", 413: "too_large", 400: "bad_context", 422: "build_failed"}
"""The outcome a refusal is counted as, by its status."""


def _refusal(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "code": status}}, status_code=status)


class ImageBuildRoute:
    """The route (`handle`); one per app, its builds shared by every client."""

    def __init__(self, backends: Backends, settings: Settings, metrics: ServerMetrics | None = None) -> None:
        """`metrics`: where each request's outcome is counted (None: nowhere)."""
        self._settings = settings
        self._metrics = metrics
        self._builds = ImageBuilds(backends, image_map={})  # mapped here, before the tag is computed
        self._backends = backends

    async def handle(self, request: Request) -> JSONResponse:
        if self._metrics is None:
            return await self._serve(request)
        try:
            response = await self._serve(request)
        except Exception:
            self._metrics.image_build("error")
            raise
        if response.status_code == 200:
            outcome = "built" if json.loads(response.body).get("built") else "present"
        else:
            outcome = _REFUSALS.get(response.status_code, "other")
        self._metrics.image_build(outcome)
        return response

    async def _serve(self, request: Request) -> JSONResponse:
        if not self._settings.image_builds:
            return _refusal(403, "image builds are off on this server (its operator enables them with "
                                 "IMAGE_BUILDS=true)")
        if "docker" not in self._backends.names:
            return _refusal(409, f"this server has no Docker backend (SANDBOX_BACKENDS: "
                                 f"{', '.join(self._backends.names)})")
        limit = self._settings.image_build_max_mb << 20
        try:
            body = await _read_at_most(request, limit)
        except ClientDisconnect:
            return _refusal(400, "the client went away before the build context arrived")
        if body is None:
            return _refusal(413, f"build context over {self._settings.image_build_max_mb} MiB "
                                 "(IMAGE_BUILD_MAX_MB)")
        state = self._settings.state_dir / "builds"
        state.mkdir(parents=True, exist_ok=True)
        context = Path(tempfile.mkdtemp(prefix="context-", dir=state))
        # Unpacking and hashing are CPU and disk work on untrusted bytes: a worker thread, never the event loop.
        preparing = asyncio.ensure_future(asyncio.to_thread(_prepare, body, context, UnpackCaps(limit),
                                                            self._settings.image_map))
        tag: str | None = None
        try:
            try:
                tag, mapped = await asyncio.shield(preparing)
            except ContextTooLargeError as exc:
                return _refusal(413, f"build context refused: {exc}")
            except ContextError as exc:
                return _refusal(400, f"not a build context: {exc}")
            try:
                built = await self._builds.ensure(context, tag)
            except UnknownBackendError as exc:
                return _refusal(409, str(exc))
            except SandboxError as exc:
                return _refusal(422, str(exc))
            return JSONResponse({"image": tag, "built": built, "mapped": mapped})
        finally:
            self._remove_later(context, preparing, tag)

    def _remove_later(self, context: Path, preparing: asyncio.Future[tuple[str, list[str]]],
                      tag: str | None) -> None:
        """Remove `context` once nothing uses it: not while its unpacking thread still writes into it (the asker
        went away mid-unpack), nor before a build that reads it has ended (a build goes on without its asker)."""
        loop = asyncio.get_running_loop()

        def remove() -> None:
            loop.run_in_executor(None, shutil.rmtree, context, True)

        if preparing.done():
            self._builds.after(tag, remove)
            return

        def unpacked(done: asyncio.Future[tuple[str, list[str]]]) -> None:
            if not done.cancelled():
                done.exception()  # retrieved: its asker is gone, nobody else will
            remove()

        preparing.add_done_callback(unpacked)


def _prepare(body: bytes, context: Path, caps: UnpackCaps, image_map: Mapping[str, str]) -> tuple[str, list[str]]:
    """Unpack `body` into `context`, rewrite its Dockerfile's base images by `image_map`, and name its image;
    the tag and the rewrites. `ContextError` (or `ContextTooLargeError`) if refused."""
    unpack(body, context, caps)
    dockerfile = context / "Dockerfile"
    if not dockerfile.is_file():
        raise ContextError("no Dockerfile at its top")
    mapped: list[str] = []
    if image_map:
        raw = dockerfile.read_bytes().decode("utf-8", errors="surrogateescape")
        text, mapped = rewrite_from(raw, image_map)
        if mapped:
            dockerfile.write_bytes(text.encode("utf-8", errors="surrogateescape"))
            log.info("build context's base image mapped: %s", "; ".join(mapped))
    return image_tag(content_hash(context)), mapped


async def _read_at_most(request: Request, limit: int) -> bytes | None:
    """The body, or None as soon as it passes `limit` bytes (nothing more is read)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return None
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
    return b"".join(parts)
