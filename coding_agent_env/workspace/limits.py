"""A request's sandbox limits, resolved against the server's: each asked-for value must be within the server's
own (an operator's cap, not a default to be exceeded), and the server's stands for what is not asked."""

from __future__ import annotations

import dataclasses

from coding_agent_env.errors import RequestError
from coding_agent_env.models import Task
from coding_agent_env.sandbox.base import SandboxLimits
from coding_agent_env.settings import Settings

__all__ = ["LimitsError", "resolve_limits"]

_SETTING = {"memory_mb": "SANDBOX_MEMORY_MB", "disk_mb": "SANDBOX_DISK_MB",
            "max_processes": "SANDBOX_MAX_PROCESSES", "cpus": "SANDBOX_CPUS"}


class LimitsError(RequestError):
    """A request asked for more than the server allows a sandbox."""


def resolve_limits(request: Task, settings: Settings) -> SandboxLimits:
    """The limits of the request's sandbox; `LimitsError` naming the first value over the server's cap."""
    caps = SandboxLimits.from_settings(settings)
    if request.limits is None:
        return caps
    asked = request.limits.model_dump(exclude_none=True)
    for name, value in asked.items():
        cap = getattr(caps, name)
        unbounded = name == "cpus" and cap == 0
        if value > cap and not unbounded:
            raise LimitsError(f"limits.{name} {value} is over this server's cap of {cap} ({_SETTING[name]})")
    return dataclasses.replace(caps, **asked)
