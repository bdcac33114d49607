"""A client disconnect during a rollout cancels it and leaves no process behind; one rollout per session; a
closed session runs nothing more."""

from __future__ import annotations

import json
import os
import socket
import uuid
from pathlib import Path

from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.helpers import wait_until
from tests.protocol.live import LiveServer


def processes_with(marker: str) -> list[int]:
    """PIDs whose command line contains `marker` (read from /proc; no signals sent)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            found.append(int(entry.name))
    return found


def test_disconnect_during_rollout_kills_the_sandbox(server: LiveServer) -> None:
    marker = f"{uuid.uuid4().int % 10**6 + 1000}.{uuid.uuid4().int % 1000:03d}"  # a unique sleep duration
    arguments = {"instruction": "wait", "agent": "oracle", "solution": [f"sleep {marker}"], "agent_timeout_s": 2000}
    step = {"type": "step", "data": {"type": "call_tool", "tool_name": "run_rollout", "arguments": arguments}}
    with connect(server.ws) as ws:
        ws.send(json.dumps(step))
        wait_until(lambda: bool(processes_with(f"sleep {marker}")), what="the agent's process to start")
        assert server.sessions.active == 1
    wait_until(lambda: not processes_with(f"sleep {marker}"), what="the sandbox to be torn down")
    wait_until(lambda: server.sessions.active == 0, what="the session to be freed")


def test_a_session_runs_one_rollout_at_a_time(server: LiveServer) -> None:
    marker = f"{uuid.uuid4().int % 10**6 + 1000}.{uuid.uuid4().int % 1000:03d}"
    body = {"jsonrpc": "2.0", "method": "openenv/session/create", "id": 1}
    with httpx.Client(base_url=server.http, timeout=60) as http:
        session_id = http.post("/mcp", json=body).json()["result"]["session_id"]
        arguments = {"instruction": "wait", "agent": "oracle", "solution": [f"sleep {marker}"]}
        with connect(f"{server.ws}?session_id={session_id}") as ws:
            step = {"type": "step", "data": {"type": "call_tool", "tool_name": "run_rollout", "arguments": arguments}}
            ws.send(json.dumps(step))
            wait_until(lambda: bool(processes_with(f"sleep {marker}")), what="the first rollout")
            call = {"jsonrpc": "2.0", "method": "tools/call", "id": 2,
                    "params": {"name": "run_rollout", "arguments": arguments, "session_id": session_id}}
            busy = http.post("/mcp", json=call).json()["error"]
            assert busy["code"] == -32603 and "already running a rollout" in busy["message"]
            closing = {"jsonrpc": "2.0", "method": "openenv/session/close", "id": 3, "params": {"session_id": session_id}}
            assert http.post("/mcp", json=closing).json()["result"]["closing"] is True
    wait_until(lambda: not processes_with(f"sleep {marker}"), what="teardown after detach")
    wait_until(lambda: server.sessions.active == 0, what="session closed at detach")


def test_jsonrpc_client_disconnect_cancels_its_rollout(server: LiveServer) -> None:
    marker = f"{uuid.uuid4().int % 10**6 + 1000}.{uuid.uuid4().int % 1000:03d}"
    arguments = {"instruction": "wait", "agent": "oracle", "solution": [f"sleep {marker}"], "agent_timeout_s": 2000}
    call = {"jsonrpc": "2.0", "method": "tools/call", "id": 1, "params": {"name": "run_rollout", "arguments": arguments}}
    body = json.dumps(call).encode()
    request = (f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    with socket.create_connection(("127.0.0.1", server.port)) as raw:
        raw.sendall(request)
        wait_until(lambda: bool(processes_with(f"sleep {marker}")), what="the rollout to start")
    wait_until(lambda: not processes_with(f"sleep {marker}"), what="teardown after the HTTP client left")
    wait_until(lambda: server.sessions.active == 0, what="the temporary session freed")


def test_a_closed_session_refuses_to_run_and_the_server_carries_on(server: LiveServer, oracle_task: dict[str, Any]) -> None:
    """`openenv/session/close` while a WebSocket is attached answers `closing`: from then on the session runs
    nothing (it used to run whatever came next). Other sessions are untouched."""
    step = {"type": "step", "data": {"type": "call_tool", "tool_name": "run_rollout", "arguments": oracle_task}}
    with httpx.Client(base_url=server.http, timeout=60) as http:

        def rpc(method: str, **params: Any) -> dict[str, Any]:
            return http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).json()

        session_id = rpc("openenv/session/create")["result"]["session_id"]
        with connect(f"{server.ws}?session_id={session_id}") as ws, connect(server.ws) as other:
            assert rpc("openenv/session/close", session_id=session_id)["result"]["closing"] is True
            refused = rpc("tools/call", name="run_rollout", arguments=oracle_task, session_id=session_id)["error"]
            expected = f"Session {session_id} is closing (a close was requested while its WebSocket is attached)"
            assert refused["code"] == -32602 and refused["message"].startswith(expected)
            ws.send(json.dumps(step))
            frame = json.loads(ws.recv(timeout=60))
            assert frame == {"type": "error", "data": {"code": "SESSION_ERROR", "message": refused["message"]}}
            with pytest.raises(ConnectionClosed):
                ws.recv(timeout=10)  # the session ended with its socket
            other.send(json.dumps(step))
            reply = json.loads(other.recv(timeout=60))
            assert reply["data"]["observation"]["result"]["data"]["reward"] == 1.0
        wait_until(lambda: server.sessions.active == 0, what="both sessions freed")
        gone = rpc("tools/call", name="run_rollout", arguments=oracle_task, session_id=session_id)["error"]
        assert gone["code"] == -32602 and gone["message"] == f"Unknown session_id: {session_id}"
        assert http.get("/health").json() == {"status": "healthy"}
