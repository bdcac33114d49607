"""Server URLs as clients need them (standard library only: the trainer-side harness imports this too)."""

from __future__ import annotations

__all__ = ["ws_url"]


def ws_url(base_url: str) -> str:
    """`http(s)://host[/prefix]` or `ws(s)://...` or a bare host -> the `/ws` URL."""
    base = base_url.rstrip("/")
    for plain, secure in (("http://", "ws://"), ("https://", "wss://")):
        if base.startswith(plain):
            base = secure + base[len(plain):]
    if not base.startswith(("ws://", "wss://")):
        base = "ws://" + base
    return base + "/ws"
