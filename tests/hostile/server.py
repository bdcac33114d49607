"""A live `coding-agent-env serve` in a subprocess of its own, and a prober that keeps asking it `/health`.

The server runs out of the test's process on purpose: an attack that blocked its event loop (or a thread the
loop waits on) must fail the test by the prober's figures, not hang the test runner with it. It is stopped by
its process group, SIGKILL after a grace period, so even a frozen server never outlives its test.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from coding_agent_env.settings import LocalConfig, Settings
from tests.helpers import free_port, serving, wait_until

CANARY = "cae-operator-secret-4f1d9a"
"""In the server's environment (as an operator's API key is) and in a file of its state dir: no sandbox may
read it."""
CANARY_FILE = "operator-secret.txt"
START_DEADLINE_S = 60.0
PROBE_EVERY_S = 0.1
PROBE_TIMEOUT_S = 5.0



class HostileServer:
    """`coding-agent-env serve` on a free loopback port, with its own state dir and sandbox uid range."""

    def __init__(self, state_dir: Path, *, docker: dict[str, str] | None = None,
                 settings: dict[str, str] | None = None, args: Sequence[str] = ()) -> None:
        """`docker`: the Docker backend's variables (enables it); `settings`: further variables, over the rest;
        `args`: more of `serve`'s arguments (`--tasks PATH`)."""
        self.state_dir = state_dir
        (state_dir / CANARY_FILE).write_text(CANARY)
        self.port = free_port()
        self.uid_base = 600_000 + secrets.randbelow(20_000) * 64
        env = {
            **os.environ,
            "STATE_DIR": str(state_dir),
            "SANDBOX_UID_BASE": str(self.uid_base),
            "SANDBOX_UID_COUNT": "64",
            "ENABLE_WEB_INTERFACE": "false",
            "SANDBOX_BACKENDS": "local,docker" if docker else "local",
            "MAX_CONCURRENT_ENVS": "4",
            # A stall is the loop held half a second: what /health's probe would feel (its bound is 1 s).
            "LOOP_STALL_WARN_MS": "500",
            **(docker or {}),
            **(settings or {}),
            "CAE_HOSTILE_CANARY": CANARY,
        }
        self.log = state_dir.parent / f"{state_dir.name}.server.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "coding_agent_env.cli", "serve", "--port", str(self.port), *args],
                env=env, start_new_session=True, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            )
        self._wait_up()

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def settings(self) -> Settings:
        """Settings naming what this server's sandboxes use (state dir, uid range), for leftover checks."""
        local = LocalConfig(uid_base=self.uid_base, uid_count=64)
        return Settings(state_dir=self.state_dir, backends=(local,))

    def _wait_up(self) -> None:
        wait_until(serving(f"{self.http}/health", self.proc, self.log_text), lambda: f"the server to start: "
                   f"{self.log_text()[-3000:]}", timeout_s=START_DEADLINE_S, interval_s=0.05)

    def loop_stats(self) -> dict[str, object]:
        """The server's event-loop watchdog figures (`GET /health/loop`)."""
        answer = httpx.get(f"{self.http}/health/loop", timeout=PROBE_TIMEOUT_S)
        answer.raise_for_status()
        return answer.json()

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> bool:
        """Stop the server's process group; True when SIGTERM sufficed (a frozen server needs SIGKILL)."""
        if self.proc.poll() is not None:
            return True
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(20)
            return True
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(20)
            return False


@dataclass
class HealthProbe:
    """Asks `/health` every `PROBE_EVERY_S` on a thread of its own; the worst answer time and any failure."""

    url: str
    worst_s: float = 0.0
    answers: int = 0
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> HealthProbe:
        self._thread = threading.Thread(target=self._run, name="health-probe", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        # At least one answer measured, however quickly the attack ended (a probe with none proves nothing).
        try:
            wait_until(lambda: self.answers > 0 or self._thread is None or not self._thread.is_alive(),
                       "the probe's first answer", timeout_s=PROBE_TIMEOUT_S + 1, interval_s=0.01)
        except AssertionError:
            pass  # none in time: `answers` stays 0, which the attack's test checks
        self._stop.set()
        if self._thread is not None:
            self._thread.join(PROBE_TIMEOUT_S + 1)

    def _run(self) -> None:
        with httpx.Client(timeout=PROBE_TIMEOUT_S) as client:
            while not self._stop.is_set():
                start = time.monotonic()
                try:
                    status = client.get(f"{self.url}/health").status_code
                    if status != 200:
                        self.failures.append(f"HTTP {status}")
                except httpx.HTTPError as exc:
                    self.failures.append(type(exc).__name__)
                self.worst_s = max(self.worst_s, time.monotonic() - start)
                self.answers += 1
                self._stop.wait(PROBE_EVERY_S)
