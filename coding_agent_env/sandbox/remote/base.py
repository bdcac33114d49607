"""A sandbox over a remote engine that offers only "run this argv" and "put/get this file" (hf, e2b).

Its engine is a `RemoteTransport` (run, put a file, get a file); commands, kills and listings come from the
launcher (`LauncherSandbox`), whose files `install()` copies in. Paths live under a per-sandbox root directory
in the remote machine: `ROOT/{workspace,home,tmp,logs}` and the launcher's own `ROOT/.machinery`; commands run
as the engine's own user. So a task that asks for a directory at an absolute path (its `workdir`, further
`writable_roots`, `/tests`) or for other users is refused at create (`refuse_layout`), before anything runs.
"""

from __future__ import annotations

import abc
import asyncio
import base64

from coding_agent_env.settings.backends import E2bConfig, HfConfig, K8sConfig, LauncherTimeouts
from coding_agent_env.errors import (
    SandboxError,
    SandboxFileError,
    SandboxFileNotFoundError,
    SandboxFileNotRegularError,
    SandboxUnavailableError,
    SandboxUnsupportedError,
)
from coding_agent_env.sandbox.base import SandboxPaths, SandboxSpec, over_read_cap, read_cap
from coding_agent_env.sandbox.launcher import client
from coding_agent_env.sandbox.launcher.client import InnerLayout
from coding_agent_env.sandbox.launcher.inside import fileops
from coding_agent_env.sandbox.launcher.sandbox import LauncherSandbox
from coding_agent_env.sandbox.launcher.transport import Transport

__all__ = ["RemoteSandbox", "RemoteTransport", "check_public_relay", "llm_refusal", "refuse_layout", "remote_layout"]


class RemoteTransport(Transport):
    """A remote engine: runs argvs, and puts and gets whole files."""

    @abc.abstractmethod
    async def put_file(self, path: str, data: bytes) -> None:
        """Write a file (its parent exists) on the engine."""


def remote_layout(root: str) -> tuple[SandboxPaths, InnerLayout]:
    """The sandbox paths and the launcher's machinery under `root`."""
    paths = SandboxPaths(workdir=f"{root}/workspace", home=f"{root}/home", tmp=f"{root}/tmp", logs=f"{root}/logs")
    return paths, InnerLayout(base=f"{root}/.machinery")


def refuse_layout(spec: SandboxSpec, backend: str) -> None:
    """`SandboxUnsupportedError` naming what of `spec` a remote sandbox cannot honour: its paths are under a root
    directory of its own (never `/app`, `/solution` or `/tests` themselves), and its commands run as the
    engine's own unprivileged user (no root, no other users)."""
    where = "a remote sandbox's directories are under its own root directory"
    if spec.workdir is not None:
        raise SandboxUnsupportedError(backend, "workdir", f"{where}, not at {spec.workdir!r}")
    if spec.writable_roots:
        raise SandboxUnsupportedError(backend, "writable_roots", f"{where}, not at {', '.join(spec.writable_roots)}")
    if spec.tests:
        raise SandboxUnsupportedError(backend, "tests", f"{where}: it cannot show hidden tests at /tests")
    if spec.users:
        raise SandboxUnsupportedError(backend, "users", "its commands run as the engine's own unprivileged user, "
                                                        "never as root or another user")


def llm_refusal(config: HfConfig | E2bConfig | K8sConfig, backend: str, network: str) -> str | None:
    """Why a remote backend refuses network policy `network` (`llm` needs the operator's public relay opt-in)."""
    if network != "llm" or config.public_relay:
        return None
    return (f"network policy 'llm' on the {backend} backend needs the public relay route: the operator enables it "
            f"with {config.ENV['public_relay']}=true (the agent then gets the relay's public URL and a per-rollout "
            "token, never the key)")


def check_public_relay(spec: SandboxSpec, config: HfConfig | E2bConfig | K8sConfig, backend: str) -> str | None:
    """The relay URL a remote sandbox with network policy `llm` gets (the server's public relay route), None for
    other policies; `SandboxUnavailableError` when the operator has not enabled it for this backend."""
    if spec.network != "llm":
        return None
    refusal = llm_refusal(config, backend, spec.network)
    if refusal is not None:
        raise SandboxUnavailableError(refusal)
    if spec.relay is None or not spec.relay.public_url:
        raise SandboxUnavailableError(f"network policy 'llm' on the {backend} backend: no public relay URL")
    return spec.relay.public_url


_STATUS_MAX = 4096
"""The most of a run's status file read (a few bytes of JSON)."""


def _base64_size(n: int) -> int:
    return 4 * ((n + 2) // 3)


class RemoteSandbox(LauncherSandbox):
    """One remote sandbox under `root`. `tidy`: close() first kills every launcher and removes the root
    (engines shared between sandboxes, or to keep close deterministic) before closing the transport."""

    def __init__(self, transport: RemoteTransport, root: str, *, backend: str, sandbox_id: str, isolation: str,
                 network: str, timeouts: LauncherTimeouts, rlimits: dict[str, int], tidy: bool) -> None:
        paths, layout = remote_layout(root)
        super().__init__(transport, layout, paths, timeouts=timeouts, rlimits=rlimits, command_uid=None)
        self.backend, self.id, self.isolation, self.network = backend, sandbox_id, isolation, network
        self._remote = transport
        self.root = root
        self._tidy = tidy

    async def install(self) -> None:
        """Create the root, the sandbox directories and the machinery, and copy the launcher in."""
        dirs = [*client.roots(self.paths), self.layout.run_dir, self.layout.fresh_dir]
        code, _, err = await self.run_machinery(["mkdir", "-p", "--", *dirs])
        if code != 0:
            raise SandboxError(f"cannot prepare the sandbox: {err.decode(errors='replace')[-300:]}")
        files = client.launcher_files()
        await asyncio.gather(*(self._remote.put_file(f"{self.layout.code_dir}/{name}", data)
                               for name, data in files.items()))

    async def read_bytes(self, path: str, *, max_bytes: int | None = None, tail: bool = False) -> bytes:
        self._check_open()
        _, full = client.confine(self.paths, path)
        info = await self.stat(full)
        real = info.get("real")
        if real is None or info.get("kind") == "missing":
            raise SandboxFileNotFoundError(f"no such file in the sandbox: {path!r}")
        if not client.inside(self.paths, real):
            raise SandboxFileError(f"{path!r} resolves outside the sandbox")
        if info.get("kind") != "file":
            raise SandboxFileNotRegularError(f"{path!r} is not a regular file")
        # Always through the launcher's `read` (O_NOFOLLOW | O_NONBLOCK, a regular file only: a symlink at
        # `full` is refused, a FIFO swapped in since the stat is not waited on), and only the slice asked for
        # crosses the vendor's API (base64 on the launcher's stdout): an agent may leave a log of gigabytes.
        cap = read_cap(max_bytes)
        end = "tail" if tail else "head"
        argv = self.layout.launcher_argv("read", full, str(cap), end)
        code, out, err = await self.run_machinery(argv, max_out=_base64_size(cap))
        if code == fileops.NOT_REGULAR:
            raise SandboxFileNotRegularError(f"{path!r} is not a regular file")
        if code == fileops.MISSING:
            raise SandboxFileNotFoundError(f"no such file in the sandbox: {path!r}")
        if code != 0:
            raise SandboxFileError(f"cannot read {path!r}: {err.decode(errors='replace')[-200:]}")
        return over_read_cap(path, base64.b64decode(out), max_bytes)

    async def _read_status(self, path: str) -> bytes:
        """Commands here run as the engine's own user, who can write the run directory: a FIFO planted at a
        status path would hang the engine's own file read, so it goes through the launcher's `read` (regular
        files only, never waiting)."""
        argv = self.layout.launcher_argv("read", path, str(_STATUS_MAX), "head")
        code, out, err = await self.run_machinery(argv, max_out=_base64_size(_STATUS_MAX))
        if code == fileops.MISSING:
            raise SandboxFileNotFoundError(f"no status file {path!r}")
        if code != 0:
            raise SandboxError(f"cannot read the status file {path!r}: {err.decode(errors='replace')[-200:]}")
        return base64.b64decode(out)

    async def write_bytes(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        self._check_open()
        root, full = client.confine(self.paths, path)
        if full == root:
            raise SandboxFileError(f"cannot write over the directory {path!r}")
        await self._prepare(full, root)
        await self._remote.put_file(full, data)
        code, _, err = await self.run_machinery(["chmod", format(mode, "o"), "--", full])
        if code != 0:
            raise SandboxFileError(f"cannot chmod {path!r}: {err.decode(errors='replace')[-200:]}")

    async def _prepare(self, full: str, root: str) -> None:
        code, _, err = await self.run_machinery(self.layout.launcher_argv("prepare", full, root))
        if code != 0:
            raise SandboxFileError(f"cannot prepare {full!r}: {err.decode(errors='replace')[-200:]}")

    async def mkdir(self, path: str) -> None:
        self._check_open()
        root, full = client.confine(self.paths, path)
        if full != root:
            await self._prepare(f"{full}/.", root)

    async def _close(self) -> None:
        try:
            if self._tidy:
                await self.run_machinery(self.layout.launcher_argv("killall", "--run-dir", self.layout.run_dir))
                await self.run_machinery(["rm", "-rf", "--", self.root])
        finally:
            await self._remote.close()
