"""A sandbox over a remote engine that offers only "run this argv" and "put/get this file" (hf, e2b).

Subclasses implement three primitives (`_run`, `_put`, `_get`) and `_close`; everything else (timeouts that
kill the tree, background processes, fresh verify context, confined file operations) comes from the
in-sandbox launcher, copied in by `install()`. Paths live under a per-sandbox root directory in the remote
machine: `ROOT/{workspace,home,tmp,logs}` and the launcher's own `ROOT/.machinery`.
"""

from __future__ import annotations

import abc
import asyncio
import base64
import json
import time
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from coding_agent_env.errors import SandboxError, SandboxFileError, SandboxFileNotFoundError
from coding_agent_env.sandbox import _inner
from coding_agent_env.sandbox._inner import InnerLayout, OutputCap
from coding_agent_env.sandbox.base import ExecResult, FileEntry, Process, Sandbox, SandboxPaths
from coding_agent_env.settings import Settings

__all__ = ["RemoteProcess", "RemoteSandbox"]

_GRACE_S = 10.0
"""Engine-side slack past a command's timeout: the launcher kills the tree first."""
_SMALL_TIMEOUT_S = 60.0


class RemoteSandbox(Sandbox):
    """Launcher-driven sandbox; see the module docstring."""

    def __init__(self, settings: Settings, root: str) -> None:
        super().__init__()
        self._settings = settings
        self.root = root
        self.paths = SandboxPaths(workdir=f"{root}/workspace", home=f"{root}/home", tmp=f"{root}/tmp", logs=f"{root}/logs")
        self.layout = InnerLayout(base=f"{root}/.machinery")
        self._limits = _inner.rlimit_args(settings)
        self.limits = MappingProxyType(_inner.rlimits(settings))

    # -- primitives ------------------------------------------------------------------------------------

    @abc.abstractmethod
    async def _run(self, argv: Sequence[str], *, env: Mapping[str, str], timeout: float | None) -> tuple[int | None, bytes, bytes]:
        """Run argv to completion on the engine; (exit code, stdout, stderr). Raise `SandboxError`."""

    @abc.abstractmethod
    async def _put(self, path: str, data: bytes) -> None:
        """Write a file (its parent exists) on the engine."""

    @abc.abstractmethod
    async def _get(self, path: str) -> bytes:
        """Read a whole file; `SandboxFileNotFoundError` when missing."""

    @abc.abstractmethod
    async def _env_args(self, token: str, env: Mapping[str, str]) -> tuple[list[str], Mapping[str, str]]:
        """How the command's env reaches the launcher: (launcher args, env for `_run`)."""

    # -- setup -----------------------------------------------------------------------------------------

    async def installed(self) -> RemoteSandbox:
        """`install()`, closing the sandbox (shielded) when that fails or is cancelled; returns self."""
        try:
            await self.install()
        except BaseException:
            await asyncio.shield(self.close())
            raise
        return self

    async def install(self) -> None:
        """Create the root, the sandbox directories and the machinery, and copy the launcher in."""
        dirs = [*_inner.roots(self.paths), self.layout.run_dir, self.layout.fresh_dir]
        code, _, err = await self._run(["mkdir", "-p", "--", *dirs], env={}, timeout=_SMALL_TIMEOUT_S)
        if code != 0:
            raise SandboxError(f"cannot prepare the sandbox: {err.decode(errors='replace')[-300:]}")
        await self._put(self.layout.launcher, _inner.launcher_source())

    async def _small(self, argv: Sequence[str]) -> tuple[int | None, bytes, bytes]:
        return await self._run(argv, env={}, timeout=_SMALL_TIMEOUT_S)

    # -- commands --------------------------------------------------------------------------------------

    async def _launch(self, argv: Sequence[str], env: Mapping[str, str] | None, cwd: str | None, timeout: float | None,
                      fresh: bool, log_path: str | None, token: str) -> tuple[int | None, bool, bytes, bytes]:
        """Run through the launcher: (exit code, timed out, stdout, stderr)."""
        full_env = self.base_env() | dict(env or {})
        _inner.check_env(full_env)
        env_args, run_env = await self._env_args(token, full_env)
        command = _inner.run_argv(self.layout, argv, token=token, cwd=cwd or self.paths.workdir, timeout=timeout,
                                  uid=None, fresh=fresh, limits=self._limits, log_path=log_path)
        at = command.index("--env-keys")
        command[at : at + 2] = env_args
        engine_timeout = None if timeout is None else timeout + _GRACE_S
        code, out, err = await self._run(command, env=run_env, timeout=engine_timeout)
        timed_out = False
        if code is not None and code >= 128:
            try:
                code, timed_out = _inner.parse_status(await self._get(self.layout.status_path(token)))
            except SandboxFileNotFoundError:
                pass
        return code, timed_out, out, err

    async def _kill(self, token: str) -> None:
        if not self.closed:
            await self._small(self.layout.launcher_argv("kill", "--token", token, "--run-dir", self.layout.run_dir))

    async def exec(self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
                   cwd: str | None = None, fresh: bool = False, max_output_bytes: int) -> ExecResult:
        self._check_open()
        token = _inner.new_token()
        started = time.monotonic()
        task = asyncio.ensure_future(self._launch(argv, env, cwd, timeout, fresh, None, token))
        try:
            code, timed_out, out, err = await asyncio.shield(task)
        except asyncio.CancelledError:
            await asyncio.shield(self._kill(token))
            raise
        except SandboxError:
            if not self.closed:
                raise
            code, timed_out, out, err = -9, False, b"", b""
        kept_out, kept_err = OutputCap(max_output_bytes), OutputCap(max_output_bytes)
        kept_out.add(out)
        kept_err.add(err)
        return ExecResult(code, bytes(kept_out.kept), bytes(kept_err.kept), time.monotonic() - started,
                          timed_out, kept_out.dropped, kept_err.dropped)

    async def spawn(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None,
                    log_path: str | None = None) -> Process:
        self._check_open()
        log = _inner.confine(self.paths, log_path)[1] if log_path else "/dev/null"
        token = _inner.new_token()
        task = asyncio.ensure_future(self._launch(argv, env, cwd, None, False, log, token))
        return RemoteProcess(self, token, task)

    # -- files -----------------------------------------------------------------------------------------

    async def _stat(self, full: str) -> dict[str, str | None]:
        code, out, err = await self._small(self.layout.launcher_argv("stat", full))
        if code != 0:
            raise SandboxFileError(f"cannot stat {full!r}: {err.decode(errors='replace')[-200:]}")
        info: dict[str, str | None] = json.loads(out)
        return info

    async def read_bytes(self, path: str, *, max_bytes: int | None = None, tail: bool = False) -> bytes:
        self._check_open()
        _, full = _inner.confine(self.paths, path)
        info = await self._stat(full)
        real = info.get("real")
        if real is None or info.get("kind") == "missing":
            raise SandboxFileNotFoundError(f"no such file in the sandbox: {path!r}")
        if not _inner.inside(self.paths, real):
            raise SandboxFileError(f"{path!r} resolves outside the sandbox")
        if info.get("kind") != "file":
            raise SandboxFileError(f"{path!r} is not a regular file")
        if max_bytes is None:
            return await self._get(real)
        # Only the slice asked for crosses the vendor's API (base64 on the launcher's stdout), never the whole
        # file: an agent may leave a log of gigabytes.
        end = "tail" if tail else "head"
        code, out, err = await self._small(self.layout.launcher_argv("read", real, str(max_bytes), end))
        if code != 0:
            raise SandboxFileError(f"cannot read {path!r}: {err.decode(errors='replace')[-200:]}")
        return base64.b64decode(out)

    async def write_bytes(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        self._check_open()
        root, full = _inner.confine(self.paths, path)
        if full == root:
            raise SandboxFileError(f"cannot write over the directory {path!r}")
        await self._prepare(full, root)
        await self._put(full, data)
        code, _, err = await self._small(["chmod", format(mode, "o"), "--", full])
        if code != 0:
            raise SandboxFileError(f"cannot chmod {path!r}: {err.decode(errors='replace')[-200:]}")

    async def _prepare(self, full: str, root: str) -> None:
        code, _, err = await self._small(self.layout.launcher_argv("prepare", full, root))
        if code != 0:
            raise SandboxFileError(f"cannot prepare {full!r}: {err.decode(errors='replace')[-200:]}")

    async def mkdir(self, path: str) -> None:
        self._check_open()
        root, full = _inner.confine(self.paths, path)
        if full != root:
            await self._prepare(f"{full}/.", root)

    async def remove(self, path: str) -> None:
        self._check_open()
        root, full = _inner.confine(self.paths, path)
        if full == root:
            raise SandboxFileError(f"refusing to remove the root {path!r}")
        code, _, err = await self._small(["rm", "-rf", "--", full])
        if code != 0:
            raise SandboxFileError(f"cannot remove {path!r}: {err.decode(errors='replace')[-200:]}")

    async def list_files(self, path: str, *, max_entries: int) -> tuple[list[FileEntry], bool]:
        self._check_open()
        _, full = _inner.confine(self.paths, path)
        info = await self._stat(full)
        real = info.get("real")
        if real is None:
            raise SandboxFileNotFoundError(f"no such directory in the sandbox: {path!r}")
        if not _inner.inside(self.paths, real) or info.get("kind") != "dir":
            raise SandboxFileError(f"{path!r} is not a directory inside the sandbox")
        code, out, err = await self._small(self.layout.launcher_argv("list", real, str(max_entries)))
        if code != 0:
            raise SandboxFileError(f"cannot list {path!r}: {err.decode(errors='replace')[-200:]}")
        listing = json.loads(out)
        return [FileEntry(p, k, s) for p, k, s in listing["entries"]], bool(listing["cut"])

    async def kill_everything(self) -> None:
        """Kill every launcher of this sandbox and remove its root (for engines shared between sandboxes)."""
        await self._small(self.layout.launcher_argv("killall", "--run-dir", self.layout.run_dir))
        await self._small(["rm", "-rf", "--", self.root])


class RemoteProcess(_inner.LauncherProcess):
    """A background command of a `RemoteSandbox`; `kill()` kills its launcher's whole tree."""

    def __init__(self, box: RemoteSandbox, token: str, task: asyncio.Future[tuple[int | None, bool, bytes, bytes]]) -> None:
        super().__init__(token)
        self._box = box
        self._task = task

    async def _exit_code(self) -> int:
        try:
            code, _, _, _ = await asyncio.shield(self._task)
        except SandboxError:
            if not self._box.closed:
                raise
            code = -9
        return code if code is not None else -9

    async def _kill(self) -> None:
        await self._box._kill(self._token)
