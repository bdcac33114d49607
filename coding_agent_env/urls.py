"""Server URLs as clients need them (standard library only: the trainer-side harness imports this too)."""

from __future__ import annotations

__all__ = ["IMAGES_PATH", "http_url", "ws_url"]

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
