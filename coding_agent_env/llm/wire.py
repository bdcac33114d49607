"""Small HTTP helpers shared by the relay's handlers: bounded JSON parsing and OpenAI-style errors."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

__all__ = ["bearer_token", "error_response", "parse_json_object"]


def parse_json_object(raw: bytes | str) -> dict[str, Any] | None:
    """The JSON object in `raw`, or None when it is not one. Total: never raises (deep nesting included)."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def bearer_token(request: web.BaseRequest) -> str | None:
    """The caller's token: `Authorization: Bearer ...`, or Anthropic clients' `x-api-key`, or Google's
    `x-goog-api-key`."""
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        key = (request.headers.get("x-api-key") or request.headers.get("x-goog-api-key") or "").strip()
        return key or None
    return token.strip()


def error_response(status: int, message: str, kind: str) -> web.Response:
    """An OpenAI-shaped error body, which the official clients turn into typed exceptions."""
    body = {"error": {"message": message, "type": kind, "code": status}}
    return web.Response(status=status, text=json.dumps(body), content_type="application/json")
