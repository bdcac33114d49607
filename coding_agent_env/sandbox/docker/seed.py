"""The image's own files where a sandbox mounts a bounded directory over them (its workdir, the task's roots).

Where the engine bounds no writable layer, the workdir (and each further root) is an anonymous volume of type
tmpfs, the disk budget (see `backend`). Docker copies an image's content into a fresh *plain* volume mounted over
a non-empty image directory, but not into one of type tmpfs: it copies at create, into a tmpfs mounted for the
copy alone, so the copy is lost and the image's directory shows empty once started (tried on Docker 20.10:
`--mount type=volume,volume-opt=type=tmpfs,...` over `WORKDIR /app` + `COPY` shows an empty /app; a plain
volume shows the files but is bounded by nothing); the backend asks for no such copy (`no_copy`). A Harbor
task image built with `WORKDIR /app` and `COPY`s, or a `RUN` that fills /app, must still show its files there,
within the disk budget. So the backend copies them itself once
the container runs (a tmpfs keeps what is written only while mounted): from a container of the same image made
for it and never started, through the archive API, streamed into the running container's mount. The copy counts
against the disk budget (content larger than the budget fails the create). A path where the image holds
nothing (or only an empty directory) is remembered per image id and costs nothing the next time.
"""

from __future__ import annotations

import io
import itertools
import posixpath
import tarfile
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import docker.errors

from coding_agent_env.sandbox.docker import tar
from coding_agent_env.sandbox.docker.engine import call
from coding_agent_env.sandbox.docker.records import Made, new_name

__all__ = ["Seeder", "copy_from_image"]

_CHUNK = 256 * 1024
_PEEK = 64 * 1024
"""Read this much of an image directory's archive before deciding it holds nothing but itself."""


class Seeder:
    """Copies an image's content onto a running container's mounts; remembers where an image holds none."""

    def __init__(self, made: Made) -> None:
        self._made = made
        self._bare: set[tuple[str, str]] = set()
        """(image id, path) where the image holds nothing to copy."""

    def wanted(self, image_id: str, paths: Sequence[str]) -> tuple[str, ...]:
        """Those of `paths` where the image may hold something (not known to be bare)."""
        return tuple(path for path in paths if (image_id, path) not in self._bare)

    async def seed(self, api: Any, image_id: str, target: str, paths: Sequence[str],
                   labels: Mapping[str, str]) -> tuple[str, ...]:
        """Copy what image `image_id` holds at each of `paths` into the running container `target` (at the same
        path); returns the paths something was copied onto (their own directory entry, with the image's owner
        and mode, too). The helper container carries `labels` (the reaper's), and is removed before this
        returns, whatever happens."""
        todo = self.wanted(image_id, paths)
        if not todo:
            return ()
        pairs = [(path, posixpath.dirname(path)) for path in todo]
        copied, bare = await copy_from_image(api, image_id, target, pairs, labels, self._made)
        self._bare.update((image_id, path) for path in bare)
        return copied


async def copy_from_image(api: Any, image_id: str, target: str, pairs: Sequence[tuple[str, str]],
                          labels: Mapping[str, str], made: Made) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """For each `(path, directory)` of `pairs`: copy the directory image `image_id` holds at `path` (itself and
    its content) into `directory` of the running container `target`, keeping its name. Returns (the paths
    copied, those where the image holds nothing but an empty directory, or no directory). The helper container
    (never started) carries `labels` and is recorded in `made` (the reaper's), and is removed before this
    returns, whatever happens.
    A container's archive stays locked while it is read: the helper is what lets the copy stream."""
    return await call("copy the image's files into the sandbox", _copy, api, image_id, target, pairs, dict(labels),
                      made)


def _copy(api: Any, image_id: str, target: str, pairs: Sequence[tuple[str, str]],
          labels: dict[str, str], made: Made) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(paths copied, paths where the image holds nothing); blocking."""
    host_config = api.create_host_config(network_mode="none")
    name = new_name()
    made.add("c", name)  # before it exists: a crash at any point leaves it recorded for the reaper
    # Never started: its command is never run (an image without CMD needs one to be created at all).
    source = str(api.create_container(image_id, command=["/"], labels=labels, network_disabled=True,
                                      host_config=host_config, name=name)["Id"])
    copied: list[str] = []
    bare: list[str] = []
    try:
        for path, directory in pairs:
            try:
                stream, stat = api.get_archive(source, path, chunk_size=_CHUNK)
            except docker.errors.NotFound:
                bare.append(path)
                continue
            try:
                if stat.get("linkTarget") or not stat.get("mode", 0) & tar.GO_MODE_DIR:
                    bare.append(path)  # a file or symlink there: the mount hides it, as Docker's would
                    continue
                head, rest = _peek(iter(stream))
                if rest is None and _members(head) <= 1:
                    bare.append(path)  # the directory alone
                    continue
                body = iter([head]) if rest is None else itertools.chain([head], rest)
                api.put_archive(target, directory, body)
                copied.append(path)
            finally:
                getattr(stream, "close", lambda: None)()
    finally:
        api.remove_container(source, force=True, v=True)
        made.forget("c", name)
    return tuple(copied), tuple(bare)


def _peek(chunks: Iterator[bytes]) -> tuple[bytes, Iterator[bytes] | None]:
    """(the stream's first `_PEEK` bytes or more, the rest of it; None when the head is all of it)."""
    head = bytearray()
    for chunk in chunks:
        head += chunk
        if len(head) > _PEEK:
            return bytes(head), chunks
    return bytes(head), None


def _members(data: bytes) -> int:
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
            return len(archive.getmembers())
    except tarfile.TarError:
        return 2  # not ours to judge: copy it, the engine says what it thinks
