"""Task images built on the Docker backend, once per tag at a time: rollouts (or clients of a server) asking for
the same environment while it builds wait for that one build. Tags are content hashes (`tasks.context`), so an
image that exists is the one asked for and is not built again; a failed build is tried again by the next asker."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from coding_agent_env.sandbox.registry import Backends

__all__ = ["ImageBuilds"]


class ImageBuilds:
    def __init__(self, backends: Backends) -> None:
        self._backends = backends
        self._running: dict[str, asyncio.Future[bool]] = {}

    async def ensure(self, context: Path, tag: str) -> bool:
        """Have `tag` built from `context` (a directory with a Dockerfile); True when this call's build made it.
        Raises what the backend raises: `UnknownBackendError` without a Docker backend, `SandboxError` for a
        failed build. The context must stay in place until this returns."""
        build = self._running.get(tag)
        if build is None:
            backend: Any = self._backends.get("docker")
            build = self._running[tag] = asyncio.ensure_future(backend.build_image(str(context), tag))
            build.add_done_callback(lambda _: self._running.pop(tag, None))
            return await asyncio.shield(build)
        await asyncio.shield(build)
        return False

    def after(self, tag: str | None, callback: Callable[[], object]) -> None:
        """Call `callback` once no build of `tag` is running (at once when none is): for removing a context a
        build may still be reading after its asker went away."""
        build = self._running.get(tag) if tag is not None else None
        if build is None or build.done():
            callback()
        else:
            build.add_done_callback(lambda _: callback())
