"""Bad input: a flood of malformed frames, oversize frames, and property-based fuzzing (hypothesis)."""

from __future__ import annotations

import json
import random
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.protocol.live import LiveServer

FLOOD = 10_000
BATCH = 200
SMALL_LIMIT = 64 * 1024


def malformed(rng: random.Random, index: int) -> tuple[str, str]:
    """One malformed frame and the error code it must get."""
    kind = index % 6
    if kind == 0:
        return "{" + "x" * rng.randint(0, 50), "INVALID_JSON"
    if kind == 1:
        return json.dumps({"type": f"nope-{rng.random()}"}), "UNKNOWN_TYPE"
    if kind == 2:
        return json.dumps({"type": "step", "data": rng.choice([1, "s", None, [1]])}), "VALIDATION_ERROR"
    if kind == 3:
        return json.dumps({"type": "step", "data": {"type": "call_tool", "tool_name": 5}}), "VALIDATION_ERROR"
    if kind == 4:
        depth = rng.randint(65, 3000)
        return "[" * depth + "]" * depth, "INVALID_JSON"
    return json.dumps({"type": "state", "data": "x" * rng.randint(1000, 40_000)}), "VALIDATION_ERROR"


def test_ten_thousand_malformed_frames(make_server: Any) -> None:
    server: LiveServer = make_server(ws_max_message_bytes=SMALL_LIMIT)
    rng = random.Random(1234)
    with connect(server.ws) as bystander, connect(server.ws, max_size=None) as ws:
        bystander.send(json.dumps({"type": "reset", "data": {"episode_id": "untouched"}}))
        bystander.recv(timeout=10)
        for start in range(0, FLOOD, BATCH):
            frames = [malformed(rng, i) for i in range(start, start + BATCH)]
            for text, _ in frames:
                ws.send(text)
            for _, code in frames:
                reply = json.loads(ws.recv(timeout=30))
                assert reply["type"] == "error" and reply["data"]["code"] == code
        ws.send(json.dumps({"type": "state"}))
        assert json.loads(ws.recv(timeout=10))["type"] == "state"
        bystander.send(json.dumps({"type": "state"}))
        state = json.loads(bystander.recv(timeout=10))["data"]
        assert (state["episode_id"], state["step_count"]) == ("untouched", 0)
    assert httpx.get(f"{server.http}/health").json() == {"status": "healthy"}


def test_oversize_frame_closes_only_that_connection(make_server: Any) -> None:
    server: LiveServer = make_server(ws_max_message_bytes=SMALL_LIMIT)
    with connect(server.ws) as bystander, connect(server.ws, max_size=None) as ws:
        ws.send("x" * (SMALL_LIMIT + 1))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
        bystander.send(json.dumps({"type": "state"}))
        assert json.loads(bystander.recv(timeout=10))["type"] == "state"
    too_big = httpx.post(f"{server.http}/mcp", content=b"x" * (SMALL_LIMIT + 1))
    assert too_big.status_code == 413


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)
envelopes = st.fixed_dictionaries(
    {"type": st.sampled_from(["reset", "step", "state", "mcp", "bogus"]) | st.text(max_size=8)},
    optional={"data": json_values | st.fixed_dictionaries(
        {"type": st.sampled_from(["list_tools", "call_tool", "x"])},
        optional={"tool_name": st.text(max_size=8), "arguments": json_values, "metadata": json_values})},
).filter(lambda envelope: envelope["type"] != "close")  # `close` ends the connection by design
rpc_requests = st.fixed_dictionaries(
    {"jsonrpc": st.sampled_from(["2.0", "1.0"]),
     "method": st.sampled_from(["tools/list", "tools/call", "openenv/session/create", "openenv/session/close",
                                "nope"]) | st.text(max_size=10)},
    optional={"params": json_values | st.fixed_dictionaries(
        {}, optional={"name": st.text(max_size=8), "session_id": st.text(max_size=8), "arguments": json_values}),
        "id": st.none() | st.integers() | st.text(max_size=5), "extra": json_values},
)


def test_fuzz_ws_envelopes(server: LiveServer) -> None:
    with connect(server.ws) as ws:

        @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(envelopes)
        def exchange(envelope: dict[str, Any]) -> None:
            ws.send(json.dumps(envelope))
            reply = json.loads(ws.recv(timeout=30))
            assert reply["type"] in {"observation", "state", "mcp", "error"}

        exchange()
        ws.send(json.dumps({"type": "state"}))
        assert json.loads(ws.recv(timeout=10))["type"] == "state"


def test_fuzz_jsonrpc(server: LiveServer) -> None:
    with httpx.Client(base_url=server.http, timeout=30) as http:

        @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(rpc_requests | json_values)
        def post(body: Any) -> None:
            response = http.post("/mcp", json=body)
            assert response.status_code == 200
            assert response.json()["jsonrpc"] == "2.0"

        post()
