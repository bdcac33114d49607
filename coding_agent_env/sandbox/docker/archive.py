"""A container's files through the Docker archive API (`get_archive`/`put_archive`), never through a shell."""

from __future__ import annotations

from typing import Any

from coding_agent_env.sandbox.docker import tar
from coding_agent_env.sandbox.docker.engine import call

__all__ = ["Archive"]


class Archive:
    """The files of container `container_id`, through `api` (a `docker.APIClient`)."""

    def __init__(self, api: Any, container_id: str) -> None:
        self._api = api
        self._id = container_id

    async def read(self, full: str, max_bytes: int, tail: bool = False) -> tuple[bytes | None, dict[str, Any]]:
        """(the regular file at `full`, cut to `max_bytes`: its first or, with `tail`, last bytes; None when it
        is not a regular file, the archive API's stat header of it: its `linkTarget`, `mode`).
        `SandboxFileNotFoundError` when missing. Memory stays within `max_bytes`. The daemon archives a FIFO
        or device as its header alone (it never opens one), so nothing here waits on what the sandbox made."""

        def fetch() -> tuple[bytes | None, dict[str, Any]]:
            stream, stat = self._api.get_archive(self._id, full, chunk_size=64 * 1024)
            try:
                if stat.get("linkTarget") or stat.get("mode", 0) & tar.GO_MODE_DIR:
                    return None, stat
                return tar.read_member(iter(stream), max_bytes, tail), stat
            finally:
                getattr(stream, "close", lambda: None)()

        return await call(f"read {full!r}", fetch)

    async def put(self, directory: str, payload: bytes, *, what: str) -> None:
        """Extract the tar `payload` under `directory` of the container."""
        await call(what, self._api.put_archive, self._id, directory, payload)
