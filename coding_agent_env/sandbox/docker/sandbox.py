"""`DockerSandbox`: one container, its commands through the launcher (`LauncherSandbox`) over the backend's
transport, its files through the archive API.

Files go in and out through the archive API (`put_archive`/`get_archive`), never through a shell; `remove()`
runs as root through the launcher's `remove` mode, which follows no symlink below the sandbox root. A symlink
at the path read is never followed (`SandboxFileNotRegularError`, as for a FIFO or a device; one pointing out
of the sandbox roots is named so); a symlinked *parent* directory is followed inside the container's own filesystem (never the host's:
the daemon confines it to the container root). `close()` removes the container (killing everything in it),
then closes the transport (and its host directory).

`limits_hit()` (engine on this host): the container's control-group counters, read once more just before it is
removed (so they still answer after close), and the workdir's disk budget as a high-water mark sampled while
commands run (`sandbox.highwater`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from coding_agent_env.settings.backends import LauncherTimeouts
from coding_agent_env.errors import SandboxError, SandboxFileError, SandboxFileNotFoundError, SandboxFileNotRegularError
from coding_agent_env.sandbox.base import Attached, ExecResult, Process, SandboxSpec, over_read_cap, read_cap
from coding_agent_env.sandbox.base import scopes as base_scopes
from coding_agent_env.sandbox.cgroups import limit_hits_of_pid
from coding_agent_env.sandbox.docker import tar
from coding_agent_env.sandbox.docker.archive import Archive
from coding_agent_env.sandbox.docker.control import ControlChannel
from coding_agent_env.sandbox.docker.engine import call
from coding_agent_env.sandbox.docker.layout import AGENTS_DIR, GUARD_DIR, LAYOUT, SandboxLayout
from coding_agent_env.sandbox.docker.transport import DockerTransport
from coding_agent_env.sandbox.highwater import HIGH_WATER, Mark
from coding_agent_env.sandbox.launcher import client
from coding_agent_env.sandbox.launcher.client import SANDBOX_UID
from coding_agent_env.sandbox.launcher.sandbox import LauncherProcess, LauncherSandbox

__all__ = ["DockerSandbox"]

_FULL_SLACK = 64 * 1024
"""A workdir with less than this free is full (a write of that size would fail)."""


class DockerSandbox(LauncherSandbox):
    """Container `container_id` on the daemon of `api` (a `docker.APIClient`), made for `spec` with its
    directories where `layout` says (default: where `spec` asks); commands run as uid 1000 through `transport`
    (or, with `spec.users`, as the user they name). `limits`: the container's own (`memory`, `pids`,
    `nano_cpus`) and the rlimits the launcher sets."""

    backend = "docker"
    isolation = "docker"

    def __init__(
        self,
        container_id: str,
        transport: DockerTransport,
        *,
        api: Any,
        spec: SandboxSpec,
        layout: SandboxLayout | None = None,
        rlimits: Mapping[str, int],
        container_limits: Mapping[str, int],
        timeouts: LauncherTimeouts,
        relay_port: int,
        scopes: Mapping[str, str] | None = None,
        engine_here: bool = False,
    ) -> None:
        layout = layout if layout is not None else SandboxLayout.of(spec)
        self.spec = spec
        """What it was made for (a template made of it forks members of the same)."""
        self.sandbox_layout = layout
        self._after_close: list[Callable[[], Awaitable[None]]] = []
        self._keep = False
        self._removed = False
        super().__init__(transport, LAYOUT, layout.paths, timeouts=timeouts, rlimits=rlimits, command_uid=SANDBOX_UID,
                         writable_roots=layout.roots, users=spec.users)
        self._docker = transport
        self._api = api
        self._archive = Archive(api, container_id)
        self.id = container_id
        self.limits = MappingProxyType({**container_limits, **rlimits})
        self.limit_scopes = MappingProxyType(dict(scopes) if scopes is not None else base_scopes(self.limits))
        self._engine_here = engine_here
        """The engine runs on this host (a unix socket): its containers' pids and groups are this host's."""
        self._hits_at_close: list[str] | None = None
        self._pid: int | None = None
        """The container's PID 1 as this host sees it (looked up once)."""
        self._mark: Mark | None = None
        self.network = spec.network
        self._forward_port = relay_port if spec.network == "llm" else None
        if self._forward_port is not None:
            self.relay_url = f"http://127.0.0.1:{relay_port}/v1"
        if spec.agents_dir is not None:
            self.agents_dir = AGENTS_DIR
        self.path_guard = GUARD_DIR

    async def limits_hit(self) -> list[str]:
        """From the container's control-group counters, when its engine runs on this host (else none known);
        after close, what they said just before the container was removed."""
        if self._hits_at_close is not None:
            return list(self._hits_at_close)
        if self.closed or not self._engine_here:
            return []
        return await self._read_hits()

    async def _read_hits(self) -> list[str]:
        pid = await self._host_pid()
        return await asyncio.to_thread(self._hits_of, pid) if pid > 0 else []

    async def _host_pid(self) -> int:
        if self._pid is None:
            state = (await call("inspect container", self._api.inspect_container, self.id)).get("State") or {}
            self._pid = int(state.get("Pid") or 0)
        return self._pid

    def _hits_of(self, pid: int) -> list[str]:
        hits = limit_hits_of_pid(pid)
        disk = self.limits.get("disk")
        if disk and ((self._mark is not None and self._mark.full) or self._workdir_full(pid)):
            hits.append(f"disk quota exceeded: the sandbox's disk budget of {disk >> 20} MB")
        return hits

    def _workdir_full(self, pid: int) -> bool:
        try:
            # The container's own view of its workdir, from this host: its tmpfs (or its sized layer).
            st = os.statvfs(f"/proc/{pid}/root{self.paths.workdir}")
        except OSError:
            return False
        return st.f_bavail * st.f_frsize < _FULL_SLACK

    # -- the disk's high-water mark, while commands run (engine on this host) ---------------------------

    async def exec(self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
                   cwd: str | None = None, fresh: bool = False, max_output_bytes: int,
                   user: str | None = None) -> ExecResult:
        mark = await self._disk_mark()
        if mark is not None:
            HIGH_WATER.started(mark)
        try:
            return await super().exec(argv, timeout=timeout, env=env, cwd=cwd, fresh=fresh,
                                      max_output_bytes=max_output_bytes, user=user)
        finally:
            if mark is not None:
                HIGH_WATER.ended(mark)

    async def spawn(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None,
                    log_path: str | None = None, user: str | None = None) -> Process:
        mark = await self._disk_mark()
        process = await super().spawn(argv, env=env, cwd=cwd, log_path=log_path, user=user)
        if mark is not None and isinstance(process, LauncherProcess):
            HIGH_WATER.started(mark)
            process.on_finish(lambda: HIGH_WATER.ended(mark))
        return process

    async def attach(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None,
                     user: str | None = None) -> Attached:
        """A launcher `run` started through the control channel with sockets to its stdin and from its output
        (init's message `a`): nothing of the channel is in the container's files. `SandboxUnsupportedError`
        on the `docker exec` transport."""
        if not isinstance(self._transport, ControlChannel):
            return await super().attach(argv, env=env, cwd=cwd, user=user)
        self._check_open()
        self._check_user(user)
        token = client.new_token()
        command, run_env = await self._launch_argv(argv, env, cwd, None, token=token, user=user)
        ended, stdin, output = await self._transport.attach(command, env=run_env, uid=None)
        process = LauncherProcess(self, token, asyncio.ensure_future(self._gone_if_closed(ended)))
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        try:
            reading, _ = await loop.create_connection(lambda: asyncio.StreamReaderProtocol(reader), sock=output)
            try:
                writer, _ = await loop.create_connection(asyncio.Protocol, sock=stdin)
            except BaseException:
                reading.close()
                raise
        except BaseException:
            stdin.close()
            output.close()
            await asyncio.shield(process.kill())
            raise
        return Attached(process, reader, reading, writer)  # type: ignore[arg-type]

    async def _disk_mark(self) -> Mark | None:
        """The workdir's high-water mark (`sandbox.highwater`, sampled while commands run: a workdir filled and
        emptied again within one command is still reported), where the engine runs on this host."""
        if self._mark is None and self._engine_here and self.limits.get("disk"):
            try:
                pid = await self._host_pid()
            except SandboxError:
                return None
            if pid > 0 and self._mark is None:
                self._mark = HIGH_WATER.mark(Path(f"/proc/{pid}/root{self.paths.workdir}"), _FULL_SLACK)
        return self._mark

    @property
    def removed(self) -> bool:
        """Whether closing removed the container (or found it gone)."""
        return self._removed

    def keep_container(self) -> None:
        """Closing leaves the (stopped) container to whoever took it over (a template kept as its layer)."""
        self._keep = True

    def after_close(self, callback: Callable[[], Awaitable[None]]) -> None:
        """Await `callback` once the container is removed (a template's member count, say); it must not
        raise."""
        self._after_close.append(callback)

    async def start(self) -> None:
        """Start the container; ready once its directories exist (and the forwarder listens under `llm`)."""
        await self._docker.boot(self._api, self.id, self._forward_port)

    async def own_dirs(self, paths: tuple[str, ...]) -> None:
        """Give `paths` back to the sandbox user (owner, mode 0755): mounts the image's content was copied onto,
        whose own directory entry came with the image's owner and mode."""
        argv = self.layout.launcher_argv("dirs", SandboxLayout.owned_dirs(paths))
        code, _, err = await self.run_machinery(argv, privileged=True)
        if code != 0:
            raise SandboxError(f"cannot prepare {', '.join(paths)}: {err.decode(errors='replace')[-300:]}")

    async def read_bytes(self, path: str, *, max_bytes: int | None = None, tail: bool = False) -> bytes:
        self._check_open()
        _, full = self.confine(path)
        try:
            data, stat = await self._archive.read(full, read_cap(max_bytes), tail)
        except SandboxFileNotFoundError as exc:
            raise SandboxFileNotFoundError(f"no such file in the sandbox: {path!r}") from exc
        if data is None:
            target = stat.get("linkTarget")
            if target and not self.inside(target):
                raise SandboxFileError(f"{path!r} resolves outside the sandbox")
            kind = "a symlink, not followed" if target else "not a file"
            raise SandboxFileNotRegularError(f"{path!r} is not a regular file ({kind})")
        return over_read_cap(path, data, max_bytes)

    async def write_bytes(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        self._check_open()
        root, full = self.confine(path)
        rel = tar.split_root(root, full)
        if not rel:
            raise SandboxFileError(f"cannot write over the directory {path!r}")
        await self._archive.put(root, tar.file_tar(rel, data, mode=mode, uid=SANDBOX_UID), what=f"write {path!r}")

    async def mkdir(self, path: str) -> None:
        self._check_open()
        root, full = self.confine(path)
        rel = tar.split_root(root, full)
        if rel:
            await self._archive.put(root, tar.dir_entries_tar([rel], SANDBOX_UID), what=f"mkdir {path!r}")

    async def _close(self) -> None:
        if self._mark is not None:
            HIGH_WATER.forget(self._mark)
        try:
            if self._engine_here:
                # The counters go with the container's group: read them a last time (best effort).
                try:
                    self._hits_at_close = await self._read_hits()
                except SandboxError:
                    self._hits_at_close = []
        finally:
            try:
                if not self._keep:
                    await call("remove container", self._api.remove_container, self.id, force=True, v=True)
                    self._removed = True
            except SandboxFileNotFoundError:
                self._removed = True  # already gone
            finally:
                try:
                    await self._docker.close()
                finally:
                    # One shielded run: a cancellation while one callback runs does not skip the others.
                    await asyncio.shield(self._closed_callbacks())

    async def _closed_callbacks(self) -> None:
        for callback in self._after_close:
            await callback()
