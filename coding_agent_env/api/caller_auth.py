"""The caller credential: with `settings.api_token` set, one ASGI middleware in front of every route.

A request carries the token as `Authorization: Bearer <token>`, or as `X-API-Token: <token>` (for a server behind
a gateway that uses `Authorization` itself, e.g. a private Hugging Face Space, whose gateway checks the caller's
HF token there). Either header matching lets the request through; the comparison is constant-time
(`hmac.compare_digest`) and neither the token nor what a caller sent is ever logged or echoed.

Refused: HTTP requests get 401 with a JSON `detail` and `WWW-Authenticate: Bearer`; a WebSocket handshake gets the
same 401 response where the server supports ASGI's denial response (uvicorn does), else it is closed before being
accepted with 1008 (policy violation; the client sees 403). OpenEnv 0.10's clients raise on a refused handshake
naming the status; openenv-core 0.3's cannot send headers at all.

Open without the token (`OPEN_PATHS`, `OPEN_PREFIXES`): `/health` (and `/health/loop`), `/metadata`, `/schema`,
the OpenAPI schema and docs (they describe, and run or read nothing), `/` (a redirect); the relay's public route
(`/llm/`: per-rollout tokens of its own); the web tab (`/web`: gradio's own login, whose password is the token,
`api.ui.tab`); `/metrics` when `metrics_token` is set (its own bearer token; otherwise it needs the caller token:
its labels name task sets and backends).
"""

from __future__ import annotations

import hmac
import json

from starlette.types import ASGIApp, Receive, Scope, Send

from coding_agent_env.api.ui.gate import WEB_PATH
from coding_agent_env.settings import PUBLIC_RELAY_PATH, Settings
from coding_agent_env.urls import TOKEN_HEADER

__all__ = ["CallerAuth", "token_matches"]

_TOKEN_HEADER = TOKEN_HEADER.lower().encode()
"""The second header a caller may carry the token in, as ASGI gives header names (lower case)."""

OPEN_PATHS = frozenset({"/", "/health", "/health/loop", "/metadata", "/schema", "/openapi.json", "/docs",
                        "/docs/oauth2-redirect", "/redoc", WEB_PATH})
OPEN_PREFIXES = (PUBLIC_RELAY_PATH.rsplit("/", 1)[0] + "/", WEB_PATH + "/")
METRICS_PATH = "/metrics"

MISSING = ("this server requires a caller token: send 'Authorization: Bearer <API_TOKEN>' or "
           "'X-API-Token: <API_TOKEN>'")
WRONG = "the caller token is not this server's API_TOKEN"
POLICY_VIOLATION = 1008


def token_matches(given: bytes, token: bytes) -> bool:
    """Constant-time equality (the time does not depend on where the two differ)."""
    return hmac.compare_digest(given, token)


class CallerAuth:
    """ASGI middleware: requests to a guarded path pass only with the token (`settings.api_token`)."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        if settings.api_token is None:
            raise ValueError("CallerAuth guards with settings.api_token, which is not set")
        self.app = app
        self._token = settings.api_token.get_secret_value().encode()
        self._open_paths = OPEN_PATHS | ({METRICS_PATH} if settings.metrics_token is not None else frozenset())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or self._is_open(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope.get("headers", []))
        if refusal is None:
            await self.app(scope, receive, send)
        elif scope["type"] == "http":
            await _deny_http(send, refusal)
        else:
            await _deny_websocket(scope, receive, send, refusal)

    def _is_open(self, path: str) -> bool:
        return path in self._open_paths or path.startswith(OPEN_PREFIXES)

    def _refusal(self, headers: list[tuple[bytes, bytes]]) -> str | None:
        """None when a header carries the token, else why the request is refused."""
        given = [value for name, value in headers if name.lower() == _TOKEN_HEADER]
        for name, value in headers:
            scheme, _, credential = value.partition(b" ")
            if name.lower() == b"authorization" and scheme.lower() == b"bearer":
                given.append(credential.strip())
        if not given:
            return MISSING
        # Every candidate is compared (no early exit on the first), so the time says nothing about which matched.
        matched = [token_matches(value.strip(), self._token) for value in given]
        return None if any(matched) else WRONG


def _denial(detail: str) -> tuple[list[tuple[bytes, bytes]], bytes]:
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"www-authenticate", b"Bearer")]
    return headers, body


async def _deny_http(send: Send, detail: str) -> None:
    headers, body = _denial(detail)
    await send({"type": "http.response.start", "status": 401, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _deny_websocket(scope: Scope, receive: Receive, send: Send, detail: str) -> None:
    await receive()  # websocket.connect
    if "websocket.http.response" in scope.get("extensions", {}):
        headers, body = _denial(detail)
        await send({"type": "websocket.http.response.start", "status": 401, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        await send({"type": "websocket.close", "code": POLICY_VIOLATION, "reason": detail})
