"""Small HTTP helpers shared by the relay's handlers: bounded JSON parsing, the caller's token, errors in the
caller's dialect (OpenAI-style for chat completions)."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from coding_agent_env.llm.dialects import Dialect, key_headers

__all__ = ["bearer_token", "error_in", "error_response", "parse_json_object"]


def parse_json_object(raw: bytes | str) -> dict[str, Any] | None:
    """The JSON object in `raw`, or None when it is not one. Total: never raises (deep nesting included)."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def bearer_token(request: web.BaseRequest) -> str | None:
    """The caller's token: `Authorization: Bearer ...`, or the header a dialect's clients send their key in
    (Anthropic's `x-api-key`, Google's `x-goog-api-key`: `Dialect.key_header`)."""
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        key = next((value for name in key_headers() if (value := request.headers.get(name))), "").strip()
        return key or None
    return token.strip()


def error_response(status: int, message: str, kind: str) -> web.Response:
    """An OpenAI-shaped error body, which the official clients turn into typed exceptions."""
    body = {"error": {"message": message, "type": kind, "code": status}}
    return web.Response(status=status, text=json.dumps(body), content_type="application/json")


def error_in(dialect: Dialect | None, status: int, message: str, kind: str) -> web.Response:
    """An error in `dialect`'s shape (`kind` is chat completions' error type: a dialect has its own, by status)."""
    if dialect is None:
        return error_response(status, message, kind)
    return web.Response(status=status, text=json.dumps(dialect.error_body(status, message)),
                        content_type="application/json")
