"""The gate's HTTP routes (aiohttp), all behind the per-rollout bearer token.

The routes see the gate only through `GateRoutes`, so this module never imports the `Gate` that serves it.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from aiohttp import web

from coding_agent_env.errors import RolloutClosedError
from coding_agent_env.gate.state import RolloutState
from coding_agent_env.gate.synth import sse_events
from coding_agent_env.settings import Settings

__all__ = ["GateRoutes", "build_app"]


class GateRoutes(Protocol):
    """What the routes need of the gate; called on its owning loop only."""

    def rollout_for_token(self, token: str | None) -> RolloutState | None:
        """The open or closed rollout this token was minted for; None for a missing, unknown or revoked one."""

    async def submit(self, state: RolloutState, body: dict[str, Any]) -> dict[str, Any]:
        """Queue an agent call for the trainer and return its answer (`RolloutClosedError`, `TimeoutError`)."""

    async def mark_exited(self, state: RolloutState) -> None:
        """The agent said it is done: no more calls from this rollout."""


def build_app(gate: GateRoutes, settings: Settings) -> web.Application:
    """Routes: POST /v1/chat/completions, GET /v1/models, POST /v1/exit; anything else 404 (after auth)."""

    async def handle(request: web.Request) -> web.StreamResponse:
        state = gate.rollout_for_token(_bearer(request))
        if state is None:
            return _error(401, "missing, unknown or revoked gate token", "authentication_error")
        path = request.path.rstrip("/")
        if path in ("/v1/chat/completions", "/chat/completions") and request.method == "POST":
            return await _chat(request, gate, state, settings)
        if path in ("/v1/models", "/models") and request.method == "GET":
            return web.json_response({"object": "list", "data": []})
        if path in ("/v1/exit", "/exit") and request.method == "POST":
            await gate.mark_exited(state)
            return web.json_response({"ok": True})
        return _error(404, f"no route {request.method} {path}", "not_found")

    app = web.Application(client_max_size=settings.gate_max_body_bytes)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


async def _chat(request: web.Request, gate: GateRoutes, state: RolloutState, settings: Settings) -> web.StreamResponse:
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        return _error(413, f"request body over {settings.gate_max_body_bytes} bytes", "too_large")
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        body = None
    if not isinstance(body, dict):
        return _error(400, "request body is not a JSON object", "invalid_request_error")
    try:
        completion = await gate.submit(state, body)
    except RolloutClosedError as exc:
        return _error(410, str(exc), "rollout_closed")
    except TimeoutError:
        return _error(504, "the trainer did not answer in time", "gate_timeout")
    if body.get("stream") is not True:
        return web.json_response(completion)
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    await response.write(b"".join(sse_events(completion, include_usage)))
    await response.write_eof()
    return response


def _bearer(request: web.BaseRequest) -> str | None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def _error(status: int, message: str, kind: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)
