"""`Transport`: how a launcher-driven sandbox reaches its engine, the one part each engine implements.

A transport runs an argv to completion in the sandbox (as root or as a given uid, with exactly the given
environment) and reads a file back. Everything else a sandbox does (the launcher's timeouts and tree kills,
background processes, exit statuses, listing and removing files) is built on that by `LauncherSandbox`.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from coding_agent_env.sandbox.launcher.client import OutputCap

__all__ = ["Ran", "Transport"]


@dataclass(frozen=True)
class Ran:
    """How a command a transport ran ended."""

    code: int | None
    """Its exit code; None when the sandbox (container, VM) went away under it."""
    status: bytes | None = None
    """The launcher's status file of a `run`, when the transport brought it back with the reply."""


class Transport(abc.ABC):
    """One sandbox's way into its engine. Raise `SandboxError` (or a subclass) for the engine's failures."""

    name: str
    """What it is, for reports and tests (`control`, `exec`, `hf`, ...)."""

    brings_status: bool = False
    """Whether `Ran.status` is always given when the launcher left one (else it is read with `read_file`)."""

    @abc.abstractmethod
    async def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        uid: int | None,
        out: OutputCap,
        err: OutputCap,
        timeout: float | None = None,
        kill: bool = False,
    ) -> Ran:
        """Run argv to completion as `uid` (None: the engine's own user, root in a container) with exactly
        `env`, its stdout and stderr into the caps. `timeout`: the engine may end it past this (None: never).
        `kill`: the argv is a launcher `kill`, which a transport may deliver its own way."""

    async def start(
        self, argv: Sequence[str], *, env: Mapping[str, str], uid: int | None, out: OutputCap, err: OutputCap
    ) -> asyncio.Future[Ran]:
        """Start a background run: failures to start it may raise here, its end is the future's."""
        return asyncio.ensure_future(self.run(argv, env=env, uid=uid, out=out, err=err))

    @abc.abstractmethod
    async def read_file(self, path: str) -> bytes:
        """A whole file (a launcher status file, say); `SandboxFileNotFoundError` when missing."""

    async def pass_env(self, token: str, env: Mapping[str, str]) -> tuple[list[str], Mapping[str, str]]:
        """How a command's environment reaches the launcher run under `token`: (its launcher args, the
        environment of the run). By default by name, in the run's own environment (never in an argv)."""
        return ["--env-keys", ",".join(env)], env

    async def close(self) -> None:
        """Release the transport's own resources (idempotent); the sandbox is its backend's to end."""
