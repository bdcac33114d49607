"""`POST /mcp` in OpenEnv's JSON-RPC dialect (PROTOCOL.md §3.2-3.3): always HTTP 200."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from coding_agent_env.models import RolloutRequest
from tests.helpers import wait_until
from tests.protocol.live import LiveServer


def rpc(http: httpx.Client, method: str, params: Any = None, request_id: Any = 1) -> dict[str, Any]:
    body: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "id": request_id}
    if params is not None:
        body["params"] = params
    response = http.post("/mcp", json=body)
    assert response.status_code == 200
    return response.json()


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{oops", -32700),
        (b"{}", -32600),
        (b'{"jsonrpc": "1.0", "method": "tools/list", "id": 1}', -32600),
        (b'{"jsonrpc": "2.0", "method": "tools/list", "params": [], "id": 1}', -32600),
        (b'{"jsonrpc": "2.0", "method": "tools/list", "id": 1, "extra": true}', -32600),
        (b"[]", -32600),
    ],
)
def test_envelope_errors(http: httpx.Client, body: bytes, code: int) -> None:
    response = http.post("/mcp", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 200
    reply = response.json()
    assert set(reply) == {"jsonrpc", "id", "error"} and reply["id"] is None
    assert reply["error"]["code"] == code
    if code == -32700:
        assert reply["error"]["message"] == "Parse error"


def test_methods_and_their_errors(http: httpx.Client) -> None:
    assert rpc(http, "initialize_nope")["error"] == {
        "code": -32601, "message": "Method not found: initialize_nope", "data": None}
    listed = rpc(http, "tools/list", {}, request_id="a")
    assert listed["id"] == "a" and set(listed) == {"jsonrpc", "id", "result"}
    [tool] = listed["result"]["tools"]
    assert tool["name"] == "run_rollout" and tool["inputSchema"] == RolloutRequest.model_json_schema()
    assert all("description" in prop for prop in tool["inputSchema"]["properties"].values())
    assert rpc(http, "tools/call", {})["error"]["message"] == "Missing 'name' in params"
    assert rpc(http, "tools/call", {"name": "x"})["error"] == {
        "code": -32603, "message": "Unknown tool: 'x'", "data": None}
    bad = rpc(http, "tools/call", {"name": "run_rollout", "arguments": {"instruction": ""}})["error"]
    assert bad["code"] == -32603 and bad["message"].startswith("Error calling tool 'run_rollout': instruction")
    assert rpc(http, "tools/list", {"session_id": "gone"})["error"] == {
        "code": -32602, "message": "Unknown session_id: gone", "data": None}
    assert rpc(http, "openenv/session/close", {})["error"]["message"] == "Invalid params - 'session_id' is required"


def test_stateless_and_session_tool_calls(server: LiveServer, http: httpx.Client, oracle_task: dict) -> None:
    result = rpc(http, "tools/call", {"name": "run_rollout", "arguments": oracle_task})["result"]
    assert result["data"]["status"] == "completed" and result["content"][0]["type"] == "text"
    assert server.sessions.active == 0  # the temporary session is gone
    session_id = rpc(http, "openenv/session/create", {})["result"]["session_id"]
    call = {"name": "run_rollout", "arguments": oracle_task, "session_id": session_id}
    assert rpc(http, "tools/call", call)["result"]["data"]["reward"] == 1.0
    session = server.sessions.get(session_id)
    assert session.rollouts_completed == 1 and session.step_count == 0
    assert rpc(http, "openenv/session/close", {"session_id": session_id})["result"] == {
        "session_id": session_id, "closed": True}
    assert server.sessions.active == 0


def test_idle_http_sessions_are_reaped(make_server: Any) -> None:
    server = make_server(session_idle_timeout_s=1.5, session_reap_interval_s=0.05)  # seconds: a loaded machine pauses
    with httpx.Client(base_url=server.http) as http:
        session_id = rpc(http, "openenv/session/create", {})["result"]["session_id"]
        assert server.sessions.active == 1
        wait_until(lambda: server.sessions.active == 0, what="idle session reaped")
        assert rpc(http, "tools/list", {"session_id": session_id})["error"]["code"] == -32602
