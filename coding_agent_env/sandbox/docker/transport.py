"""`DockerTransport`: how commands reach a container's launcher, chosen once per backend (`control`, `exec`).

A Docker transport is made before its container: it says how the container's PID 1 starts and what it mounts
(`container_spec`, for the sandbox's `SandboxLayout`), then starts the container and returns once the sandbox
is ready (`boot`).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from coding_agent_env.sandbox.launcher.transport import Transport

if TYPE_CHECKING:
    from coding_agent_env.sandbox.docker.layout import SandboxLayout

__all__ = ["ContainerSpec", "DockerTransport"]


@dataclass(frozen=True)
class ContainerSpec:
    """What a transport needs of its container: PID 1's argv, bind mounts (as the SDK's `volumes`), labels."""

    command: list[str]
    volumes: dict[str, dict[str, str]] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)


class DockerTransport(Transport):
    @abc.abstractmethod
    def container_spec(self, forward_port: int | None, layout: SandboxLayout) -> ContainerSpec:
        """PID 1 and mounts for a sandbox laid out as `layout` (its directories made before `boot` returns);
        with `forward_port`, the LLM forwarder must listen there (network `llm`)."""

    @abc.abstractmethod
    async def boot(self, api: Any, container_id: str, forward_port: int | None) -> None:
        """Start the created container `container_id`; ready once its directories exist (and, with
        `forward_port`, the forwarder listens). `SandboxError` if it is not."""
