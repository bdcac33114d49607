"""Startup checks: every enabled sandbox backend is probed and its orphans reaped before the first request,
so an absent engine is reported when the server starts, not discovered by the first rollout."""

from __future__ import annotations

import asyncio
import logging

from coding_agent_env.errors import CodingAgentEnvError
from coding_agent_env.sandbox.registry import Backends

__all__ = ["check_backends"]

log = logging.getLogger(__name__)


async def check_backends(backends: Backends) -> dict[str, str]:
    """`{backend: "ok (<isolation>)" | "unavailable: <why>"}` for each enabled backend; never raises for a
    backend that cannot run (the server still serves the others)."""
    report: dict[str, str] = {}
    for name in backends.names:
        try:
            backend = backends.get(name)
            status = await asyncio.to_thread(backend.check)
            if not status.available:
                raise CodingAgentEnvError(status.detail)
            reaped = await backend.reap_orphans()
        except CodingAgentEnvError as exc:
            log.warning("sandbox backend %s is unavailable: %s", name, exc)
            report[name] = f"unavailable: {exc}"
            continue
        if reaped:
            log.warning("sandbox backend %s: removed %d sandboxes left by a crashed server", name, reaped)
        log.info("sandbox backend %s: %s (%s)", name, status.isolation, status.detail)
        report[name] = f"ok ({status.isolation})"
    return report
