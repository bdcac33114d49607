"""A fake of the part of the `e2b` SDK (2.x, async) the E2B backend uses, running "the VM" on this host.

The E2B cloud is unreachable here, so the backend's tests run against this fake. It follows the SDK's
surface and semantics: `AsyncSandbox.create(template=, timeout=, metadata=, allow_internet_access=,
api_key=)` returning an object with `sandbox_id`, `commands.run(cmd: str, envs=, user=, cwd=, timeout=)`
running `cmd` through `/bin/bash -l -c` (like envd) and raising the SDK's own `CommandExitException` for a
non-zero exit and `TimeoutException` at the timeout (0 = none), `files.read(path, format="bytes")` /
`files.write(path, data)` raising the SDK's `FileNotFoundException`, and `kill()`. Environment: envd's base
(PATH, HOME) plus `envs`. What it cannot fake: the VM boundary and network policy (commands are host
processes), so tests that need those are skipped for it with that reason.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
from typing import Any, ClassVar, Literal

import e2b

__all__ = ["FakeAsyncSandbox"]


class _Commands:
    def __init__(self, owner: FakeAsyncSandbox) -> None:
        self._owner = owner

    async def run(self, cmd: str, envs: dict[str, str] | None = None, user: str | None = None,
                  cwd: str | None = None, timeout: float | None = 60, **_: Any) -> e2b.CommandResult:
        self._owner.require_running()
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/home/user"}
        env.update(envs or {})
        proc = await asyncio.create_subprocess_exec(
            "/bin/bash", "-c", cmd, env=env, cwd=cwd, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
        )
        self._owner.pgids.add(proc.pid)
        try:
            async with asyncio.timeout(timeout or None):
                out, err = await proc.communicate()
        except TimeoutError:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            raise e2b.TimeoutException("command timed out") from None
        finally:
            self._owner.pgids.discard(proc.pid)
        result = e2b.CommandResult(stdout=out.decode("utf-8", "replace"), stderr=err.decode("utf-8", "replace"),
                                   exit_code=proc.returncode or 0, error=None)
        if proc.returncode:
            raise e2b.CommandExitException(stdout=result.stdout, stderr=result.stderr,
                                           exit_code=proc.returncode, error=None)
        return result


class _Files:
    def __init__(self, owner: FakeAsyncSandbox) -> None:
        self._owner = owner

    async def read(self, path: str, format: Literal["text", "bytes"] = "text", **_: Any) -> str | bytearray:
        self._owner.require_running()
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            raise e2b.FileNotFoundException(f"file {path} not found") from None
        return bytearray(data) if format == "bytes" else data.decode()

    async def write(self, path: str, data: str | bytes, **_: Any) -> None:
        self._owner.require_running()
        os.makedirs(os.path.dirname(path), exist_ok=True)  # envd creates parents
        with open(path, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)


class FakeAsyncSandbox:
    """`e2b.AsyncSandbox` as the backend uses it. `created` records every create call's arguments."""

    created: ClassVar[list[dict[str, Any]]] = []

    def __init__(self) -> None:
        self.sandbox_id = f"fake-{secrets.token_hex(6)}"
        self.commands = _Commands(self)
        self.files = _Files(self)
        self.pgids: set[int] = set()
        self.running = True

    @classmethod
    async def create(cls, template: str | None = None, timeout: int | None = None, metadata: dict[str, str] | None = None,
                     allow_internet_access: bool | None = None, api_key: str | None = None, **_: Any) -> FakeAsyncSandbox:
        cls.created.append({"template": template, "timeout": timeout, "metadata": metadata,
                            "allow_internet_access": allow_internet_access})
        return cls()

    def require_running(self) -> None:
        if not self.running:
            raise e2b.SandboxNotFoundException("sandbox was killed")

    async def kill(self) -> bool:
        """Ends every process of the "VM", like destroying it."""
        self.running = False
        for pgid in list(self.pgids):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return True
