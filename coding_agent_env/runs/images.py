"""Task images built on the Docker backend, once per tag at a time: rollouts (or clients of a server) asking for
the same environment while it builds wait for that one build. Tags are content hashes (`tasks.context`), so an
image that exists is the one asked for and is not built again; a failed build is tried again by the next asker.

With an image map (`IMAGE_MAP`, `run --image-map`; `tasks.images`), a Dockerfile whose `FROM` it rewrites is
built from a private copy of its context with the Dockerfile rewritten (the task's directory is never written),
each rewrite logged; the caller names such a build by `tasks.images.mapped_hash`, so it never shares a tag with
the unmapped one."""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from coding_agent_env.sandbox.registry import Backends
from coding_agent_env.tasks.images import rewrite_from

__all__ = ["ImageBuilds", "mapped_context"]

log = logging.getLogger(__name__)


class ImageBuilds:
    def __init__(self, backends: Backends, image_map: Mapping[str, str] | None = None) -> None:
        """`image_map`: the base images to rewrite (default: the backends' settings' `image_map`)."""
        self._backends = backends
        self._image_map = dict(backends.settings.image_map if image_map is None else image_map)
        self._running: dict[str, asyncio.Future[bool]] = {}

    async def ensure(self, context: Path, tag: str) -> bool:
        """Have `tag` built from `context` (a directory with a Dockerfile); True when this call's build made it.
        Raises what the backend raises: `UnknownBackendError` without a Docker backend, `SandboxError` for a
        failed build. The context must stay in place until this returns."""
        build = self._running.get(tag)
        if build is None:
            backend: Any = self._backends.get("docker")
            build = self._running[tag] = asyncio.ensure_future(self._build(backend, context, tag))
            build.add_done_callback(lambda _: self._running.pop(tag, None))
            return await asyncio.shield(build)
        await asyncio.shield(build)
        return False

    async def _build(self, backend: Any, context: Path, tag: str) -> bool:
        if not self._image_map:
            return bool(await backend.build_image(str(context), tag))
        scratch = Path(tempfile.mkdtemp(prefix="mapped-", dir=_builds_dir(self._backends)))
        try:
            notes = await asyncio.to_thread(mapped_context, context, scratch / "context", self._image_map)
            if not notes:
                return bool(await backend.build_image(str(context), tag))
            log.info("building %s with its base image mapped: %s", tag, "; ".join(notes))
            return bool(await backend.build_image(str(scratch / "context"), tag))
        finally:
            await asyncio.to_thread(shutil.rmtree, scratch, True)

    def after(self, tag: str | None, callback: Callable[[], object]) -> None:
        """Call `callback` once no build of `tag` is running (at once when none is): for removing a context a
        build may still be reading after its asker went away."""
        build = self._running.get(tag) if tag is not None else None
        if build is None or build.done():
            callback()
        else:
            build.add_done_callback(lambda _: callback())


def _builds_dir(backends: Backends) -> Path:
    state = backends.settings.state_dir / "builds"
    state.mkdir(parents=True, exist_ok=True)
    return state


def mapped_context(context: Path, copy: Path, image_map: Mapping[str, str]) -> list[str]:
    """When `image_map` rewrites a `FROM` of `context`'s Dockerfile: `context` copied to `copy` (links kept as
    links, as the engine would be sent them) with the Dockerfile rewritten, and the rewrites' notes. Nothing is
    copied (and `[]` returned) when nothing is rewritten."""
    dockerfile = context / "Dockerfile"
    if not image_map or not dockerfile.is_file() or dockerfile.is_symlink():
        return []
    text, notes = rewrite_from(dockerfile.read_text(encoding="utf-8", errors="surrogateescape"), image_map)
    if not notes:
        return []
    shutil.copytree(context, copy, symlinks=True)
    target = copy / "Dockerfile"
    target.unlink()
    target.write_text(text, encoding="utf-8", errors="surrogateescape")
    return notes
