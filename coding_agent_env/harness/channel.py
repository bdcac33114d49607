"""One WebSocket to a server's `/ws`, for the trainer-side sessions: one request, its one reply, in order.

`Channel` is what `EpisodeSession` (one episode per connection) and `CodingEnvironment` (one connection for many
episodes) talk through. Its errors say which boundary failed, so a caller can tell a dead server from a refusal:

    HarnessError                  (episodes.py re-exports it)
    ├── ServerUnreachableError        no connection could be made (refused, unresolvable, the handshake timed out)
    ├── ConnectionLostError           an open connection dropped, or a reply did not come in time (`timed_out`);
    │                                 the channel is closed (a late reply must never answer the next request)
    └── ServerRefusedError            the server answered with an error frame (`code`: EXECUTION_ERROR, ...)

Standard library and websockets only.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from websockets.exceptions import ConnectionClosed, WebSocketException
from websockets.sync.client import ClientConnection, connect

from coding_agent_env.errors import CodingAgentEnvError
from coding_agent_env.urls import caller_headers, ws_url

__all__ = [
    "Channel",
    "ConnectionLostError",
    "HarnessError",
    "ServerRefusedError",
    "ServerUnreachableError",
    "reply_data",
]

MAX_FRAME_BYTES = 100 * 1024 * 1024
CLOSING_CODES = frozenset({"CAPACITY_REACHED", "SESSION_ERROR"})
"""Error frames after which the server closes the connection (`api/protocols/ws.py`)."""


class HarnessError(CodingAgentEnvError):
    """The server refused the episode, or the connection to it failed."""


class ServerUnreachableError(HarnessError):
    """No connection to the server could be made: it is down, or the address is wrong."""


class ConnectionLostError(HarnessError):
    """An open connection to the server dropped, or its reply did not come within the deadline (`timed_out`)."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class ServerRefusedError(HarnessError):
    """The server answered with an error frame: `code` (EXECUTION_ERROR, CAPACITY_REACHED, ...) and its message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class Channel:
    """One open `/ws` connection (one server session). `ask` sends a request and returns its reply's data;
    calls from several threads take turns. `close` sends `close` (the server ends the session and tears its
    episode down) and drops the socket; idempotent, and safe from any thread. `on_closed` is called once, when
    an opened channel closes (a server pool's count of its sessions)."""

    def __init__(self, base_url: str, *, connect_timeout_s: float, message_timeout_s: float,
                 on_closed: Callable[[], None] | None = None) -> None:
        self.base_url = base_url
        self._on_closed = on_closed
        self.message_timeout_s = message_timeout_s
        self._lock = threading.Lock()
        self._exit = ExitStack()  # the connection is a context (websockets wants one); close() exits it
        self._closed = False
        try:
            self._ws: ClientConnection = self._exit.enter_context(connect(
                ws_url(base_url), open_timeout=connect_timeout_s, max_size=MAX_FRAME_BYTES, compression=None,
                additional_headers=caller_headers(),
            ))
        except (OSError, WebSocketException, TimeoutError) as exc:
            raise ServerUnreachableError(f"cannot connect to {base_url}: {exc}") from exc

    @property
    def closed(self) -> bool:
        return self._closed

    def ask(self, message: dict[str, Any], expect: str) -> dict[str, Any]:
        """The data of the reply of type `expect`. `ServerRefusedError` for an error frame (the channel stays
        open unless the server closes it: capacity, a closed session), `ConnectionLostError` when the connection
        failed or the reply did not come within `message_timeout_s` (the channel is then closed)."""
        with self._lock:
            if self._closed:
                raise HarnessError("the session is closed")
            try:
                frame = json.loads(self._exchange(json.dumps(message)))
            except TimeoutError as exc:
                self.close(send_close=False)
                raise ConnectionLostError(
                    f"the episode's connection failed: no reply within {self.message_timeout_s:g} s ({exc})",
                    timed_out=True,
                ) from exc
            except (OSError, WebSocketException, ValueError) as exc:
                # A late reply would be paired with the next request: the connection is done for (the server
                # ends the session's episode when it drops).
                self.close(send_close=False)
                raise ConnectionLostError(f"the episode's connection failed: {type(exc).__name__}: {exc}") from exc
        try:
            return reply_data(frame, expect)
        except ServerRefusedError as exc:
            if exc.code in CLOSING_CODES:
                self.close(send_close=False)
            raise

    def _exchange(self, text: str) -> str | bytes:
        """Send and receive one frame. If the server already closed (a refusal), its queued error frame is still
        the answer."""
        try:
            self._ws.send(text)
        except ConnectionClosed:
            return self._ws.recv(timeout=self.message_timeout_s)
        return self._ws.recv(timeout=self.message_timeout_s)

    def close(self, *, send_close: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if send_close:
                with contextlib.suppress(OSError, WebSocketException, RuntimeError):
                    self._ws.send(json.dumps({"type": "close"}))  # else already gone: a disconnect ends it too
        finally:
            with contextlib.suppress(OSError, WebSocketException, RuntimeError):
                self._exit.close()
            if self._on_closed is not None:
                self._on_closed()


def reply_data(frame: dict[str, Any], kind: str) -> dict[str, Any]:
    """The data of a server frame of type `kind`; `ServerRefusedError` for an error frame (its code and message),
    `HarnessError` for a frame of another type."""
    if not isinstance(frame, dict):
        raise HarnessError(f"unexpected reply: a JSON {type(frame).__name__}")
    if frame.get("type") == "error":
        data = frame.get("data") or {}
        raise ServerRefusedError(str(data.get("code", "ERROR")), str(data.get("message", "")))
    if frame.get("type") != kind:
        raise HarnessError(f"unexpected reply: {str(frame.get('type'))[:50]}")
    return frame.get("data") or {}
