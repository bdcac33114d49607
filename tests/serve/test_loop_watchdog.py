"""The event-loop watchdog: a loop held by a blocking call is detected, counted and logged with the blocking
function in the stack; a live server under a burst of requests has no stall; the lifespan starts and stops it."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from websockets.asyncio.client import connect

from coding_agent_env.aio_watchdog import LoopWatchdog
from coding_agent_env.api import build_app
from coding_agent_env.settings import Settings
from tests.helpers import poll, wait_until
from tests.protocol.live import LiveServer

TICK_S = 0.01
STALL_S = 0.05
HOLD_DEADLINE_S = 10.0
"""How long the blocking call below holds the loop at most, waiting for the watchdog to report it."""


def hold_the_loop_until_reported(watchdog: LoopWatchdog) -> None:
    """A blocking call on the loop thread (time.sleep, never awaited): it holds the loop until the watchdog's
    thread has reported the stall, or fails at the deadline. Not `wait_until`: the tests below find this
    function among the innermost frames of the stall's stack."""
    deadline = time.monotonic() + HOLD_DEADLINE_S
    while watchdog.stats.last_stall is None:
        if time.monotonic() > deadline:
            raise AssertionError("the watchdog did not report a loop held for 10 s")
        time.sleep(0.005)


async def test_a_blocking_call_is_a_stall_with_its_function_in_the_stack(caplog: pytest.LogCaptureFixture) -> None:
    watchdog = LoopWatchdog(TICK_S, STALL_S)
    caplog.set_level(logging.WARNING, logger="coding_agent_env.aio_watchdog")
    watchdog.start()
    try:
        await _ticked(watchdog, 3)
        assert watchdog.stats.stalls == 0

        async def culprit() -> None:
            hold_the_loop_until_reported(watchdog)

        await asyncio.create_task(culprit(), name="the-culprit")
        await _ticked(watchdog, watchdog.stats.ticks + 2)  # the loop runs again: the stall is over
    finally:
        watchdog.stop()
    stats = watchdog.stats
    assert stats.stalls == 1
    assert stats.lag_max_ms >= STALL_S * 1000
    stall = stats.last_stall
    assert stall is not None and stall.blocked_ms >= STALL_S * 1000
    assert stall.task is not None and stall.task.startswith("the-culprit (")
    # The innermost frames are the blocking call's (or the watchdog's `stats`, which it polls).
    assert any("in hold_the_loop_until_reported" in entry for entry in stall.stack[-2:])
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "the-culprit" in warnings[0] and "hold_the_loop_until_reported" in warnings[0]


async def test_a_stall_in_a_plain_callback_names_no_task() -> None:
    watchdog = LoopWatchdog(TICK_S, STALL_S)
    watchdog.start()
    try:
        asyncio.get_running_loop().call_soon(hold_the_loop_until_reported, watchdog)
        await _ticked(watchdog, 3)
        wait_until(lambda: watchdog.stats.stalls == 1, what="the stall counted")
    finally:
        watchdog.stop()
    stall = watchdog.stats.last_stall
    assert stall is not None and stall.task is None
    assert any("hold_the_loop_until_reported" in entry for entry in stall.stack)


async def test_an_idle_loop_has_no_stall_and_stop_ends_the_thread() -> None:
    watchdog = LoopWatchdog(TICK_S, STALL_S)
    watchdog.start()
    assert watchdog.running
    await _ticked(watchdog, 10)
    watchdog.stop()
    watchdog.stop()  # idempotent
    assert not watchdog.running
    stats = watchdog.stats
    assert stats.stalls == 0 and stats.last_stall is None and stats.ticks >= 10
    with pytest.raises(RuntimeError):
        watchdog.start()


def test_it_needs_positive_figures() -> None:
    with pytest.raises(ValueError):
        LoopWatchdog(0, STALL_S)
    with pytest.raises(ValueError):
        LoopWatchdog(TICK_S, -1)


async def _ticked(watchdog: LoopWatchdog, ticks: int) -> None:
    """Await (letting the loop run) until the watchdog has ticked `ticks` times, or fail at a deadline."""
    await poll(lambda: watchdog.stats.ticks >= ticks,
               lambda: f"{ticks} ticks of the watchdog (it ticked {watchdog.stats.ticks})",
               timeout_s=HOLD_DEADLINE_S, interval_s=TICK_S)


# -- in a live server ---------------------------------------------------------------------------------------

BURST_CLIENTS = 16
BURST_PAIRS = 25
"""Each client's reset+step pairs over /ws; as many tools/list calls go to /mcp beside them."""


@pytest.fixture
def live(settings: Settings) -> Iterator[LiveServer]:
    server = LiveServer(settings.model_copy(update={"max_concurrent_envs": 64})).start()
    try:
        yield server
    finally:
        server.stop()


def test_a_live_server_has_no_stall_under_a_burst(live: LiveServer) -> None:
    with httpx.Client(base_url=live.http, timeout=30) as http:
        wait_until(lambda: http.get("/health/loop").json()["ticks"] > 0, what="the first tick")
        asyncio.run(_burst(live))
        figures = http.get("/health/loop").json()
    assert figures["stalls"] == 0, figures["last_stall"]
    assert figures["last_stall"] is None
    assert figures["ticks"] > 0
    assert figures["stall_threshold_ms"] == live.settings.loop_stall_warn_ms
    assert figures["interval_ms"] == live.settings.loop_tick_ms


async def _burst(live: LiveServer) -> None:
    reset = json.dumps({"type": "reset", "data": {}})
    step = json.dumps({"type": "step", "data": {"type": "list_tools"}})
    tools_list = {"jsonrpc": "2.0", "method": "tools/list", "params": {}, "id": 1}

    async def ws_client() -> None:
        async with connect(live.ws) as ws:
            for _ in range(BURST_PAIRS):
                await ws.send(reset)
                assert json.loads(await ws.recv())["type"] == "observation"
                await ws.send(step)
                assert json.loads(await ws.recv())["data"]["observation"]["tools"]

    async def rpc_client(http: httpx.AsyncClient) -> None:
        for _ in range(BURST_PAIRS):
            assert (await http.post("/mcp", json=tools_list)).json()["result"]["tools"]

    async with httpx.AsyncClient(base_url=live.http, timeout=30) as http:
        await asyncio.gather(*(ws_client() for _ in range(BURST_CLIENTS)),
                             *(rpc_client(http) for _ in range(BURST_CLIENTS)))


def test_the_lifespan_starts_and_stops_the_watchdog(settings: Settings) -> None:
    server = LiveServer(settings).start()
    try:
        watchdog = server.app.state.loop_watchdog
        assert watchdog.running
        assert any(thread.name == "loop-watchdog" for thread in threading.enumerate())
    finally:
        server.stop()
    assert not server.thread.is_alive()
    assert not watchdog.running


def test_off_by_setting(settings: Settings) -> None:
    server = LiveServer(settings.model_copy(update={"loop_watchdog": False})).start()
    try:
        assert server.app.state.loop_watchdog is None
        response = httpx.get(f"{server.http}/health/loop")
        assert response.status_code == 404 and "LOOP_WATCHDOG" in response.json()["detail"]
    finally:
        server.stop()


def test_settings_from_the_environment() -> None:
    settings = Settings.from_env({"LOOP_WATCHDOG": "false", "LOOP_TICK_MS": "20", "LOOP_STALL_WARN_MS": "100"})
    assert (settings.loop_watchdog, settings.loop_tick_ms, settings.loop_stall_warn_ms) == (False, 20.0, 100.0)


async def test_a_shutdown_cancelled_over_and_over_still_stops_the_watchdog(settings: Settings) -> None:
    app = build_app(settings.model_copy(update={"enable_web_interface": False}))
    started = asyncio.Event()

    async def serve() -> None:
        async with app.router.lifespan_context(app):
            started.set()
            await asyncio.Event().wait()  # served until cancelled

    task = asyncio.create_task(serve())
    await asyncio.wait_for(started.wait(), HOLD_DEADLINE_S)
    watchdog = app.state.loop_watchdog
    assert watchdog.running

    def ended() -> bool:
        """Whether the lifespan ended; if not, cancel it again (a cancellation at every await of the shutdown)."""
        if task.done():
            return True
        task.cancel()
        return False

    await poll(ended, "the cancelled lifespan to end", timeout_s=HOLD_DEADLINE_S, interval_s=0)
    assert not watchdog.running
