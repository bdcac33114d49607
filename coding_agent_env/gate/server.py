"""The gate's HTTP routes (aiohttp), all behind the per-rollout bearer token."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from aiohttp import web

from coding_agent_env.errors import RolloutClosedError
from coding_agent_env.gate.synth import sse_events
from coding_agent_env.settings import Settings

if TYPE_CHECKING:
    from coding_agent_env.gate.gate import Gate

__all__ = ["build_app"]


def build_app(gate: Gate, settings: Settings) -> web.Application:
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


async def _chat(request: web.Request, gate: Gate, state: Any, settings: Settings) -> web.StreamResponse:
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
