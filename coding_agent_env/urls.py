"""Server URLs as clients need them (standard library only: the trainer-side harness imports this too)."""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["API_TOKEN_VARIABLE", "IMAGES_PATH", "TOKEN_HEADER", "caller_headers", "http_url", "ws_url"]

API_TOKEN_VARIABLE = "API_TOKEN"
"""The environment variable holding a server's caller token: the server requires it, the clients send it."""

TOKEN_HEADER = "X-API-Token"
"""The header the clients carry the caller token in (the server takes it there or as `Authorization: Bearer`;
this one leaves `Authorization` to a gateway in front, e.g. a private Hugging Face Space's)."""

IMAGES_PATH = "/images"
"""Where a server takes task image builds (`api.images`)."""


def ws_url(base_url: str) -> str:
    """`http(s)://host[/prefix]` or `ws(s)://...` or a bare host -> the `/ws` URL."""
    base = base_url.rstrip("/")
    for plain, secure in (("http://", "ws://"), ("https://", "wss://")):
        if base.startswith(plain):
            base = secure + base[len(plain):]
    if not base.startswith(("ws://", "wss://")):
        base = "ws://" + base
    return base + "/ws"


def http_url(base_url: str) -> str:
    """`ws(s)://host[/prefix][/ws]` or `http(s)://...` or a bare host -> `http(s)://host[/prefix]`."""
    base = base_url.rstrip("/").removesuffix("/ws")
    for secure, plain in (("ws://", "http://"), ("wss://", "https://")):
        if base.startswith(secure):
            base = plain + base[len(secure):]
    if not base.startswith(("http://", "https://")):
        base = "http://" + base
    return base


def caller_headers(token: str | None = None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The headers carrying the caller token: `token`, else `API_TOKEN` from `environ` (default `os.environ`);
    none when there is neither (an empty value counts as none)."""
    token = token or (os.environ if environ is None else environ).get(API_TOKEN_VARIABLE) or None
    return {TOKEN_HEADER: token} if token else {}
