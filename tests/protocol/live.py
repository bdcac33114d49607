"""Test helpers: a live server in a background thread (real uvicorn, real sockets on 127.0.0.1), polling."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import uvicorn

from coding_agent_env.api import build_app
from coding_agent_env.settings import Settings

START_DEADLINE_S = 15.0


class LiveServer:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.app = build_app(settings)
        config = uvicorn.Config(
            self.app, host="127.0.0.1", port=0, log_level="warning", ws="websockets-sansio",
            ws_max_size=settings.ws_max_message_bytes, lifespan="on",
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + START_DEADLINE_S
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(START_DEADLINE_S)

    @property
    def port(self) -> int:
        return self.server.servers[0].sockets[0].getsockname()[1]

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    @property
    def sessions(self) -> Any:
        return self.app.state.sessions


def wait_until(predicate: Callable[[], bool], timeout_s: float = 15.0, what: str = "condition") -> None:
    """Poll `predicate` until true or fail at the deadline (tests never sleep to wait)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


ORACLE_TASK: dict[str, Any] = {
    "instruction": "Create hello.txt containing 'hi'.",
    "agent": "oracle",
    "solution": ["echo hi > hello.txt"],
    "verify": ["grep -qx hi hello.txt"],
}
