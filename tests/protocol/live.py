"""Test helpers: a live server in a background thread (real uvicorn, real sockets on 127.0.0.1)."""

from __future__ import annotations

import threading
from typing import Any

import uvicorn

from coding_agent_env.api import build_app
from coding_agent_env.settings import Settings
from tests.helpers import wait_until

START_DEADLINE_S = 15.0


class LiveServer:
    def __init__(self, settings: Settings, **app_options: Any) -> None:
        """`app_options`: `build_app`'s keywords (e.g. `tracing`)."""
        self.settings = settings
        self.app = build_app(settings, **app_options)
        config = uvicorn.Config(
            self.app, host="127.0.0.1", port=0, log_level="warning", ws="websockets-sansio",
            ws_max_size=settings.ws_max_message_bytes, lifespan="on",
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> LiveServer:
        self.thread.start()
        wait_until(self._started, "the live server to start", timeout_s=START_DEADLINE_S, interval_s=0.01)
        return self

    def _started(self) -> bool:
        if not self.server.started and not self.thread.is_alive():
            raise AssertionError("the live server's thread ended before the server started")
        return self.server.started

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


ORACLE_TASK: dict[str, Any] = {
    "instruction": "Create hello.txt containing 'hi'.",
    "agent": "oracle",
    "solution": ["echo hi > hello.txt"],
    "verify": ["grep -qx hi hello.txt"],
}
