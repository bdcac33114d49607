"""Several servers for one trainer or batch: sessions spread across them, each session staying on its server.

`server_urls` reads the servers a caller gives (a list, or one string of comma-separated URLs). `ServerPool`
picks the server for each new session: the one with the fewest sessions outstanding (ties in turn, so equal
servers are used round-robin), skipping servers found unreachable. A session is one WebSocket connection, so it
stays where it was opened; the pool only decides where the next one opens. Standard library only; thread-safe
(trainers open sessions from several threads; the batch runner from one event loop, never awaiting inside).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Sequence
from typing import TypeVar

from coding_agent_env.harness.channel import HarnessError, ServerUnreachableError

__all__ = ["NoServerError", "ServerPool", "server_urls"]

T = TypeVar("T")


class NoServerError(ServerUnreachableError):
    """No server of the pool could be reached: each one's reason is in the message."""


def server_urls(value: str | Sequence[str]) -> tuple[str, ...]:
    """The servers `value` names: a URL, a comma-separated string of URLs, or a sequence of either; blanks
    dropped, each server once (first mention's order). `HarnessError` when it names none."""
    parts = [value] if isinstance(value, str) else list(value)
    urls: list[str] = []
    for part in parts:
        if not isinstance(part, str):
            raise HarnessError(f"a server URL is a string, not {type(part).__name__}")
        for url in part.split(","):
            url = url.strip().rstrip("/")
            if url and url not in urls:
                urls.append(url)
    if not urls:
        raise HarnessError("no server URL given")
    return tuple(urls)


class ServerPool:
    """Where the next session opens. `acquire` gives a server (the caller `release`s it when that session ends);
    `open` does both around opening a session and moves on from a server that cannot be reached."""

    _shared: dict[tuple[str, ...], ServerPool] = {}
    _shared_lock = threading.Lock()

    @classmethod
    def shared(cls, urls: str | Sequence[str]) -> ServerPool:
        """The process's one pool for these servers: trainers make one environment instance per concurrent
        rollout (TRL's pool), each with its own factory, and their sessions must spread together."""
        key = server_urls(urls)
        with cls._shared_lock:
            if key not in cls._shared:
                cls._shared[key] = cls(key)
            return cls._shared[key]

    def __init__(self, urls: str | Sequence[str]) -> None:
        self.urls = server_urls(urls)
        self._lock = threading.Lock()
        self._outstanding = dict.fromkeys(self.urls, 0)
        self._unreachable: dict[str, str] = {}
        self._turn = 0

    def acquire(self, skip: Collection[str] = (), *, unreachable: bool = False) -> str | None:
        """The server not in `skip` with the fewest outstanding sessions (ties: the next in turn after the last one
        given), counted as having one more; None when there is none. Servers marked unreachable are left out
        unless `unreachable`."""
        with self._lock:
            candidates = [url for url in self._rotation()
                          if url not in skip and (unreachable or url not in self._unreachable)]
            if not candidates:
                return None
            url = min(candidates, key=lambda candidate: self._outstanding[candidate])  # first of the least loaded
            self._turn = (self.urls.index(url) + 1) % len(self.urls)
            self._outstanding[url] += 1
            return url

    def release(self, url: str) -> None:
        """The session opened on `url` ended (or never opened)."""
        with self._lock:
            if self._outstanding.get(url, 0) > 0:
                self._outstanding[url] -= 1

    def mark_unreachable(self, url: str, reason: str) -> None:
        """No new session goes to `url` (until `mark_reachable`); `reason` is kept for the error naming it."""
        with self._lock:
            self._unreachable[url] = reason

    def mark_reachable(self, url: str) -> None:
        with self._lock:
            self._unreachable.pop(url, None)

    def unreachable(self) -> dict[str, str]:
        """Servers found unreachable -> why."""
        with self._lock:
            return dict(self._unreachable)

    def outstanding(self) -> dict[str, int]:
        """Sessions open now per server."""
        with self._lock:
            return dict(self._outstanding)

    def open(self, connect: Callable[[str], T]) -> tuple[str, T]:
        """`connect(url)` on the server `acquire` gives, then on the next one while it raises
        `ServerUnreachableError` (each such server is marked unreachable; servers marked so earlier are tried
        again only when no other is left, and marked reachable when they answer); the server and what `connect`
        gave. `NoServerError` naming every server's reason when none could be reached (with one server, its own
        `ServerUnreachableError`); any other error of `connect` is raised as is (its server released)."""
        tried: dict[str, ServerUnreachableError] = {}
        while (url := self.acquire(skip=tried) or self.acquire(skip=tried, unreachable=True)) is not None:
            try:
                opened = connect(url)
            except ServerUnreachableError as exc:
                self.release(url)
                tried[url] = exc
                self.mark_unreachable(url, str(exc))
                continue
            except BaseException:
                self.release(url)
                raise
            self.mark_reachable(url)
            return url, opened
        if len(self.urls) == 1:
            raise tried[self.urls[0]]  # one server: its own error says it all
        detail = "; ".join(f"{url}: {tried[url]}" for url in self.urls)
        raise NoServerError(f"no server could be reached ({detail})")

    def _rotation(self) -> list[str]:
        """The servers in turn order, starting with the one whose turn it is."""
        return [*self.urls[self._turn:], *self.urls[:self._turn]]
