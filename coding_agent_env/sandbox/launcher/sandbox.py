"""`LauncherSandbox`: a sandbox whose commands run through the in-sandbox launcher, over a `Transport`.

The base of the Docker and remote (hf, e2b) sandboxes, and the launcher side's one home for how a command is
run and ended: each `exec`/`spawn` is a launcher `run` under a fresh token; the launcher kills the tree at the
timeout; past `kill_grace_s` more, or when the caller is cancelled, the server sends a launcher `kill` and
waits (at most `reply_s`) for the run to end, else the sandbox is broken (`SandboxError`). A run that ended
by a signal or timed out has its status read back (`parse_status`). A command whose sandbox is closed under
it ends with exit code -9. Machinery commands (stat, list, remove, ...) run without the launcher's `run`,
each within `machinery_s`.

Subclasses give the engine-specific rest: `read_bytes`, `write_bytes`, `mkdir` and `_close`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Self

from coding_agent_env.settings.backends import LauncherTimeouts
from coding_agent_env.errors import SandboxError, SandboxFileError, SandboxFileNotFoundError, SandboxUnsupportedError
from coding_agent_env.models.task import check_user
from coding_agent_env.sandbox.base import ExecResult, FileEntry, Process, Sandbox, SandboxPaths, scopes
from coding_agent_env.sandbox.launcher import client
from coding_agent_env.sandbox.launcher.client import InnerLayout, OutputCap
from coding_agent_env.sandbox.launcher.transport import Ran, Transport

__all__ = ["KILLED_BY_CLOSE", "LauncherProcess", "LauncherSandbox"]

KILLED_BY_CLOSE = -9
"""Exit code of a command whose sandbox was closed under it."""
_MACHINERY_OUT = 16 * 1024 * 1024
_MACHINERY_ERR = 64 * 1024


class LauncherSandbox(Sandbox):
    """See the module docstring. `command_uid`: the uid commands run as (None: the engine's own user);
    `rlimits`: set by the launcher on every command; `writable_roots`: the task's further roots, where file
    operations are allowed too (`SandboxSpec.writable_roots`); `users`: whether a command may name its user
    (`SandboxSpec.users`: `exec(user=...)`, resolved by the launcher inside, which must run as root)."""

    def __init__(
        self,
        transport: Transport,
        layout: InnerLayout,
        paths: SandboxPaths,
        *,
        timeouts: LauncherTimeouts,
        rlimits: Mapping[str, int],
        command_uid: int | None,
        writable_roots: Sequence[str] = (),
        users: bool = False,
    ) -> None:
        super().__init__()
        self._transport = transport
        self.limits = MappingProxyType(dict(rlimits))
        self.limit_scopes = MappingProxyType(scopes(self.limits))
        self._rlimit_args = client.rlimit_args(rlimits)
        self.layout, self.paths = layout, paths
        self._timeouts = timeouts
        self._command_uid = command_uid
        self.writable_roots = tuple(writable_roots)
        self._users = users

    @property
    def transport(self) -> Transport:
        """How this sandbox reaches its engine."""
        return self._transport

    async def opened(self, preparing: Awaitable[None]) -> Self:
        """This sandbox once `preparing` (its engine's start, its install) is done; when that fails or is
        cancelled, the sandbox is closed first (shielded) and the error raised."""
        try:
            await preparing
        except BaseException:
            await asyncio.shield(self.close())
            raise
        return self

    # -- running ---------------------------------------------------------------------------------------

    async def _run(self, argv: Sequence[str], env: Mapping[str, str], uid: int | None, out: OutputCap,
                   err: OutputCap, *, timeout: float | None = None, kill: bool = False) -> Ran:
        """The transport's run; an engine failure once the sandbox is closed is the command's end (`Ran(None)`)."""
        return await self._gone_if_closed(
            self._transport.run(argv, env=env, uid=uid, out=out, err=err, timeout=timeout, kill=kill))

    async def _gone_if_closed(self, running: Awaitable[Ran]) -> Ran:
        try:
            return await running
        except SandboxError:
            if self.closed:
                return Ran(None)
            raise

    async def run_machinery(self, argv: Sequence[str], *, privileged: bool = False,
                            max_out: int = _MACHINERY_OUT) -> tuple[int | None, bytes, bytes]:
        """Run a short machinery command to completion, not through the launcher's `run`: as root (the engine's
        user) with `privileged`, else as commands run; (exit code, stdout, stderr: at most `max_out` bytes of
        stdout kept). `SandboxError` past `machinery_s`."""
        out, err = OutputCap(max_out), OutputCap(_MACHINERY_ERR)
        uid = None if privileged else self._command_uid
        deadline = self._timeouts.machinery_s
        try:
            async with asyncio.timeout(deadline):
                ran = await self._run(argv, {}, uid, out, err, timeout=deadline)
        except TimeoutError:
            raise SandboxError(f"the sandbox's machinery did not answer within {deadline:.0f} s") from None
        return ran.code, bytes(out.kept), bytes(err.kept)

    async def _launch_argv(self, argv: Sequence[str], env: Mapping[str, str] | None, cwd: str | None,
                           timeout: float | None, *, token: str, fresh: bool = False,
                           log_path: str | None = None, user: str | None = None) -> tuple[list[str], Mapping[str, str]]:
        """(the launcher `run` argv for a command, the environment of that run)."""
        self._check_user(user)
        full_env = self.base_env() | dict(env or {})
        client.check_env(full_env)
        env_args, run_env = await self._transport.pass_env(token, full_env)
        command = client.run_argv(self.layout, argv, token=token, cwd=cwd or self.paths.workdir, timeout=timeout,
                                  env_args=env_args, fresh=fresh, uid=self._command_uid, user=user,
                                  limits=self._rlimit_args, log_path=log_path)
        return command, run_env

    def _check_user(self, user: str | None) -> None:
        """A command's `user` (None: the sandbox's own): refused unless the sandbox was made with users."""
        if user is None:
            return
        if not self._users:
            raise SandboxUnsupportedError(self.backend, "users",
                                          f"this sandbox was made without other users; cannot run as {user[:40]!r}")
        try:
            check_user(user)
        except ValueError as exc:
            raise SandboxError(str(exc)) from None

    def confine(self, path: str) -> tuple[str, str]:
        """`client.confine` over this sandbox's roots, the task's further ones included."""
        return client.confine(self.paths, path, self.writable_roots)

    def inside(self, real: str) -> bool:
        """Whether `real` lies under one of this sandbox's roots, the task's further ones included."""
        return client.inside(self.paths, real, self.writable_roots)

    async def exec(self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
                   cwd: str | None = None, fresh: bool = False, max_output_bytes: int,
                   user: str | None = None) -> ExecResult:
        self._check_open()
        token = client.new_token()
        command, run_env = await self._launch_argv(argv, env, cwd, timeout, token=token, fresh=fresh, user=user)
        loop = asyncio.get_running_loop()
        started = loop.time()
        out, err = OutputCap(max_output_bytes), OutputCap(max_output_bytes)
        grace = self._timeouts.kill_grace_s
        # The engine's own deadline, if it has one, comes after ours: the launcher, then we, end the command.
        run = asyncio.ensure_future(self._run(command, run_env, None, out, err, timeout=timeout + 2 * grace))
        try:
            await asyncio.wait_for(asyncio.shield(run), timeout + grace)
        except TimeoutError:
            await self._kill_run(token)
            await self._settle(run)
        except BaseException:
            await asyncio.shield(self._abort(run, token))
            raise
        code, timed_out = await self._exit_status(run.result(), token)
        return ExecResult(code, bytes(out.kept), bytes(err.kept), loop.time() - started, timed_out,
                          out.dropped, err.dropped)

    async def spawn(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None,
                    log_path: str | None = None, user: str | None = None) -> Process:
        self._check_open()
        self._check_user(user)
        log = self.confine(log_path)[1] if log_path else "/dev/null"
        token = client.new_token()
        command, run_env = await self._launch_argv(argv, env, cwd, None, token=token, log_path=log, user=user)
        sink = OutputCap(0)
        started = await self._transport.start(command, env=run_env, uid=None, out=sink, err=sink)
        return LauncherProcess(self, token, asyncio.ensure_future(self._gone_if_closed(started)))

    async def _exit_status(self, ran: Ran, token: str) -> tuple[int, bool]:
        """(exit code, timed out) of a launcher `run` that ended as `ran`."""
        if self.closed or ran.code is None:
            return KILLED_BY_CLOSE, False
        if ran.code < 128:
            return ran.code, False
        if ran.status is not None:
            return client.parse_status(ran.status)
        if self._transport.brings_status:
            return ran.code, False
        try:
            raw = await self._read_status(self.layout.status_path(token))
        except SandboxFileNotFoundError:
            return ran.code, False
        try:
            return client.parse_status(raw)
        except SandboxError:
            # Where commands can write the run directory (remote engines), a status file is theirs to spoil:
            # the launcher's own exit code (128 + signal) stands, never an infra error.
            return ran.code, False

    async def _read_status(self, path: str) -> bytes:
        """A run's status file, through the engine (a backend whose commands could put something else there
        reads it its own way)."""
        return await self._transport.read_file(path)

    async def _kill_run(self, token: str) -> None:
        """Kill a launcher's whole tree (it is gone afterwards); a closed sandbox has nothing left to kill."""
        if self.closed:
            return
        argv = self.layout.launcher_argv("kill", "--token", token, "--run-dir", self.layout.run_dir)
        deadline = self._timeouts.reply_s
        try:
            async with asyncio.timeout(deadline):
                await self._run(argv, {}, None, OutputCap(0), OutputCap(0), kill=True, timeout=deadline)
        except TimeoutError:
            if not self.closed:
                raise SandboxError(f"a kill was not answered within {deadline:.0f} s") from None

    async def _settle(self, run: asyncio.Future[Ran]) -> None:
        """Wait (bounded) for a killed command's run to finish; a sandbox where it does not is broken."""
        done, _ = await asyncio.wait([run], timeout=self._timeouts.reply_s)
        if not done:
            run.cancel()
            await asyncio.wait([run])
            raise SandboxError(f"a killed command did not finish within {self._timeouts.reply_s:.0f} s")

    async def _abort(self, run: asyncio.Future[Ran], token: str) -> None:
        """Kill and settle a command whose caller went away (errors here are dropped: the caller's stands)."""
        try:
            await self._kill_run(token)
            await self._settle(run)
        except SandboxError:
            run.cancel()
            await asyncio.wait([run])

    # -- files through the launcher ------------------------------------------------------------------------

    async def stat(self, full: str) -> dict[str, str | None]:
        """The launcher's `stat` of an absolute sandbox path: `{"real": realpath or None, "kind": ...}`."""
        code, out, err = await self.run_machinery(self.layout.launcher_argv("stat", full))
        if code != 0:
            raise SandboxFileError(f"cannot stat {full!r}: {err.decode(errors='replace')[-200:]}")
        info: dict[str, str | None] = json.loads(out)
        return info

    async def remove(self, path: str) -> None:
        self._check_open()
        root, full = self.confine(path)
        if full == root:
            raise SandboxFileError(f"refusing to remove the root {path!r}")
        # As root (an agent's mode-000 directory must not make verify's removal fail), through the launcher,
        # which follows no symlink below `root` (root's removal must not be redirected by one).
        code, _, err = await self.run_machinery(self.layout.launcher_argv("remove", full, root), privileged=True)
        if code != 0:
            raise SandboxFileError(f"cannot remove {path!r}: {err.decode(errors='replace').strip()[-200:]}")

    async def list_files(self, path: str, *, max_entries: int) -> tuple[list[FileEntry], bool]:
        self._check_open()
        _, full = self.confine(path)
        info = await self.stat(full)
        real = info.get("real")
        if real is None:
            raise SandboxFileNotFoundError(f"no such directory in the sandbox: {path!r}")
        if not self.inside(real) or info.get("kind") != "dir":
            raise SandboxFileError(f"{path!r} is not a directory inside the sandbox")
        code, out, err = await self.run_machinery(self.layout.launcher_argv("list", real, str(max_entries)))
        if code != 0:
            raise SandboxFileError(f"cannot list {path!r}: {err.decode(errors='replace')[-200:]}")
        listing = json.loads(out)
        return [FileEntry(p, k, s) for p, k, s in listing["entries"]], bool(listing["cut"])


class LauncherProcess(Process):
    """A background command of a `LauncherSandbox`, run under `token`; `kill()` kills its launcher's tree."""

    def __init__(self, box: LauncherSandbox, token: str, task: asyncio.Future[Ran]) -> None:
        self._box = box
        self._token = token
        self._task = task
        self._code: int | None = None

    @property
    def returncode(self) -> int | None:
        return self._code

    @property
    def finished(self) -> bool:
        """Whether the command's run is over (whether or not anyone waited for it)."""
        return self._task.done()

    def on_finish(self, callback: Callable[[], object]) -> None:
        """Call `callback` (on the loop) once the command's run is over, whether or not anyone waits for it."""
        self._task.add_done_callback(lambda _: callback())

    async def wait(self) -> int:
        if self._code is None:
            ran = await asyncio.shield(self._task)
            code, _ = await self._box._exit_status(ran, self._token)
            self._code = code
        return self._code

    async def kill(self) -> None:
        if self._code is None:
            await asyncio.shield(self._box._kill_run(self._token))
            await asyncio.shield(self._box._settle(self._task))
            await asyncio.shield(self.wait())
