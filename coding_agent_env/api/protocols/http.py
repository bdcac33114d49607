"""Plain HTTP routes: /health /metadata /schema /reset /step /state (PROTOCOL.md §1), and /health/loop.

`/health` answers exactly OpenEnv's body. `/health/loop` is ours: the event-loop watchdog's figures
(`aio_watchdog.LoopStats`: ticks, last and largest lag, stalls and the last one's task and stack), or 404 when
the operator turned the watchdog off.

`/reset` and `/state` are stateless, as upstream's are: they never touch a session. `/step` runs its action
in a temporary session that holds a capacity slot while it runs (503 at capacity).
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from coding_agent_env import __version__
from coding_agent_env.aio_watchdog import LoopWatchdog
from coding_agent_env.api.protocols.step import step
from coding_agent_env.api.protocols.shapes import CallToolAction, CallToolObservation, dumps
from coding_agent_env.env_state import EnvState
from coding_agent_env.session import CapacityError, SessionClosedError, SessionKind, SessionManager

__all__ = ["ENV_NAME", "build_router"]

ENV_NAME = "coding_agent_env"
ENV_DESCRIPTION = (
    "Runs CLI coding agents (OpenCode, Pi, Terminus, oracle, nop) on coding tasks in sandboxes and returns a "
    "verified, scored RolloutResult through one MCP tool, run_rollout."
)


class ResetRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    seed: int | None = Field(default=None, ge=0)
    episode_id: str | None = Field(default=None, max_length=255)


class StepRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    action: dict[str, Any]
    timeout_s: float | None = Field(default=None, gt=0)
    request_id: str | None = Field(default=None, max_length=255)


class _BaseObservation(BaseModel):
    model_config = ConfigDict(extra="forbid")
    done: bool = False
    reward: bool | int | float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


def build_router(manager: SessionManager, watchdog: LoopWatchdog | None = None) -> APIRouter:
    router = APIRouter()

    @router.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "healthy"}

    @router.get("/health/loop", include_in_schema=False)
    async def loop_health() -> Any:
        if watchdog is None:
            return JSONResponse({"detail": "the event-loop watchdog is off (LOOP_WATCHDOG=false)"}, status_code=404)
        return watchdog.stats.as_dict()

    @router.get("/metadata")
    async def metadata() -> dict[str, Any]:
        return {
            "name": ENV_NAME,
            "description": ENV_DESCRIPTION,
            "readme_content": None,
            "version": __version__,
            "author": None,
            "documentation_url": None,
        }

    @router.get("/schema")
    async def schema() -> dict[str, Any]:
        return {
            "action": CallToolAction.model_json_schema(),
            "observation": CallToolObservation.model_json_schema(),
            "state": EnvState.model_json_schema(),
            "reset_observation": _BaseObservation.model_json_schema(),
        }

    @router.post("/reset")
    async def reset(body: ResetRequest | None = None) -> dict[str, Any]:
        return {"observation": {}, "reward": None, "done": False}

    @router.post("/step")
    async def step_route(body: StepRequest) -> Any:
        try:
            session = manager.create(SessionKind.HTTP)
        except CapacityError as exc:
            return JSONResponse({"detail": str(exc)}, status_code=503)
        try:
            payload = await step(session, body.action)
            return Response(dumps(payload), media_type="application/json")  # the result as serialised once
        except ValidationError as exc:
            detail = json.loads(exc.json(include_input=False, include_url=False))
            return JSONResponse({"detail": detail}, status_code=422)
        except SessionClosedError as exc:  # its temporary session was closed under it: the server is stopping
            return JSONResponse({"detail": str(exc)}, status_code=503)
        finally:
            await manager.close(session.id)

    @router.get("/state")
    async def state() -> dict[str, Any]:
        return EnvState().model_dump()

    return router
