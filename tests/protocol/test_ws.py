"""`WS /ws`: envelopes, ordering, error codes, capacity and attach (PROTOCOL.md §2)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tests.helpers import wait_until
from tests.protocol.live import LiveServer


def ask(ws: ClientConnection, message: Any) -> dict[str, Any]:
    ws.send(message if isinstance(message, str) else json.dumps(message))
    return json.loads(ws.recv(timeout=60))


def call(arguments: dict[str, Any], tool: str = "run_rollout") -> dict[str, Any]:
    return {"type": "step", "data": {"type": "call_tool", "tool_name": tool, "arguments": arguments}}


def test_reset_step_state_semantics(server: LiveServer, oracle_task: dict[str, Any]) -> None:
    with connect(server.ws) as ws:
        assert ask(ws, {"type": "reset", "data": {"seed": 3, "episode_id": "ep-1"}}) == {
            "type": "observation", "data": {"observation": {}, "reward": None, "done": False}}
        tools = ask(ws, {"type": "step", "data": {"type": "list_tools", "metadata": {}}})
        assert [t["name"] for t in tools["data"]["observation"]["tools"]] == ["run_rollout"]
        assert "metadata" not in tools["data"]
        reply = ask(ws, call(oracle_task))
        observation = reply["data"]["observation"]
        assert observation["tool_name"] == "run_rollout" and observation["error"] is None
        result = observation["result"]
        assert result["data"]["reward"] == 1.0 and json.loads(result["content"][0]["text"]) == result["data"]
        assert reply["data"]["reward"] == 1.0 and reply["data"]["done"] is False
        state = ask(ws, {"type": "state"})
        assert state == {"type": "state", "data": {"episode_id": "ep-1", "step_count": 2, "rollouts_completed": 1,
                                                  "last_reward": 1.0, "last_status": "completed"}}
        ask(ws, {"type": "reset"})
        assert ask(ws, {"type": "state"})["data"]["step_count"] == 0


def test_tool_errors_are_observations(server: LiveServer) -> None:
    with connect(server.ws) as ws:
        unknown = ask(ws, call({}, tool="nope"))["data"]["observation"]
        assert unknown["result"] is None
        assert unknown["error"] == {"error_type": "tool_not_found", "message": "Unknown tool: 'nope'"}
        invalid = ask(ws, call({"instruction": "x", "agent": "nobody", "api_key": "sk-SECRET"}))
        error = invalid["data"]["observation"]["error"]
        assert set(error) == {"error_type", "message"} and error["error_type"] == "invalid_args"
        assert "sk-SECRET" not in json.dumps(invalid)
        backend = ask(ws, call({"instruction": "x", "agent": "nop", "sandbox": "docker"}))["data"]["observation"]
        assert backend["error"]["error_type"] == "execution_error"


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ("{not json", "INVALID_JSON"),
        ("[1, 2]", "UNKNOWN_TYPE"),
        ('{"type": "bogus"}', "UNKNOWN_TYPE"),
        ('{"data": {}}', "UNKNOWN_TYPE"),
        ('{"type": "state", "data": {}}', "VALIDATION_ERROR"),
        ('{"type": "close", "data": {}}', "VALIDATION_ERROR"),
        ('{"type": "step"}', "VALIDATION_ERROR"),
        ('{"type": "step", "data": {"type": "bogus", "tool_name": "x"}}', "VALIDATION_ERROR"),
        ('{"type": "reset", "data": [1]}', "VALIDATION_ERROR"),
        ("[" * 100 + "]" * 100, "INVALID_JSON"),
    ],
)
def test_bad_frames_get_error_frames_and_connection_stays(server: LiveServer, frame: str, code: str) -> None:
    with connect(server.ws) as ws:
        reply = ask(ws, frame)
        assert reply["type"] == "error" and reply["data"]["code"] == code
        assert isinstance(reply["data"]["message"], str)
        assert ask(ws, {"type": "state"})["type"] == "state"


def test_close_gets_no_reply_and_frees_the_session(server: LiveServer) -> None:
    with connect(server.ws) as ws:
        ask(ws, {"type": "state"})
        assert server.sessions.active == 1
        ws.send(json.dumps({"type": "close"}))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000
    wait_until(lambda: server.sessions.active == 0, what="session freed")


def test_mcp_envelope_is_bound_to_the_socket_session(server: LiveServer) -> None:
    with connect(server.ws) as ws:
        created = ask(ws, {"type": "mcp", "data": {"jsonrpc": "2.0", "method": "openenv/session/create", "id": 1}})
        own_id = created["data"]["result"]["session_id"]
        assert server.sessions.get(own_id).id == own_id  # the socket's own session, live on the server
        listed = ask(ws, {"type": "mcp", "data": {"jsonrpc": "2.0", "method": "tools/list", "id": 2}})
        assert listed["data"]["result"]["tools"][0]["name"] == "run_rollout"
        closing = ask(ws, {"type": "mcp", "data": {"jsonrpc": "2.0", "method": "openenv/session/close",
                                                  "params": {"session_id": own_id}, "id": 3}})
        assert closing["data"]["error"]["code"] == -32600


def test_capacity_is_shared_and_precise(make_server: Any) -> None:
    server = make_server(max_concurrent_envs=2)
    rpc = httpx.post(f"{server.http}/mcp", json={"jsonrpc": "2.0", "method": "openenv/session/create", "id": 1})
    assert "session_id" in rpc.json()["result"]
    with connect(server.ws) as first:
        ask(first, {"type": "state"})
        with connect(server.ws) as refused:
            frame = json.loads(refused.recv(timeout=10))
            assert frame == {"type": "error", "data": {
                "message": "Server at capacity: 2/2 sessions active. Cannot accept new connections.",
                "code": "CAPACITY_REACHED", "active_sessions": 2, "max_sessions": 2}}
            with pytest.raises(ConnectionClosed):
                refused.recv(timeout=10)
        full = httpx.post(f"{server.http}/mcp", json={"jsonrpc": "2.0", "method": "openenv/session/create", "id": 2})
        assert full.json()["error"]["code"] == -32000
        assert full.json()["error"]["data"] == {"active_sessions": 2, "max_sessions": 2}


def test_attach_to_a_jsonrpc_session(server: LiveServer, oracle_task: dict[str, Any]) -> None:
    def rpc(method: str, **params: Any) -> dict[str, Any]:
        body = {"jsonrpc": "2.0", "method": method, "params": params, "id": 7}
        return httpx.post(f"{server.http}/mcp", json=body, timeout=60).json()

    session_id = rpc("openenv/session/create")["result"]["session_id"]
    with connect(f"{server.ws}?session_id={session_id}") as ws:
        ask(ws, {"type": "reset", "data": {"episode_id": "attached"}})
        result = rpc("tools/call", name="run_rollout", arguments=oracle_task, session_id=session_id)["result"]
        assert result["data"]["reward"] == 1.0
        state = ask(ws, {"type": "state"})["data"]
        assert state["episode_id"] == "attached" and state["rollouts_completed"] == 1 and state["step_count"] == 0
        with connect(f"{server.ws}?session_id={session_id}") as second:
            frame = json.loads(second.recv(timeout=10))
            assert frame["data"] == {"message": f"Session {session_id} already has an attached WebSocket",
                                     "code": "SESSION_ERROR"}
        assert rpc("openenv/session/close", session_id=session_id)["result"] == {
            "session_id": session_id, "closed": False, "closing": True}
        ask(ws, {"type": "state"})
    wait_until(lambda: server.sessions.active == 0, what="closed at detach")
    assert rpc("tools/list", session_id=session_id)["error"]["message"] == f"Unknown session_id: {session_id}"


def test_attach_unknown_session(server: LiveServer) -> None:
    with connect(f"{server.ws}?session_id=nope") as ws:
        frame = json.loads(ws.recv(timeout=10))
        assert frame == {"type": "error", "data": {"message": "Unknown session_id: nope", "code": "SESSION_ERROR"}}


def test_detach_keeps_an_unclosed_session(server: LiveServer) -> None:
    body = {"jsonrpc": "2.0", "method": "openenv/session/create", "id": 1}
    session_id = httpx.post(f"{server.http}/mcp", json=body).json()["result"]["session_id"]
    with connect(f"{server.ws}?session_id={session_id}") as ws:
        ask(ws, {"type": "state"})
    wait_until(lambda: not server.sessions.get(session_id).attached, what="detach")
    assert server.sessions.active == 1


def test_ws_mcp_raw_jsonrpc(make_server: Any) -> None:
    server = make_server(max_concurrent_envs=1)
    url = server.ws.removesuffix("/ws") + "/mcp"
    with connect(url) as ws:
        assert ask(ws, "{nope")["error"]["code"] == -32700
        assert ask(ws, "{nope")["error"]["message"].startswith("Parse error: ")
        listed = ask(ws, {"jsonrpc": "2.0", "method": "tools/list", "id": 1})
        assert listed["result"]["tools"][0]["name"] == "run_rollout"
        own = ask(ws, {"jsonrpc": "2.0", "method": "openenv/session/create", "id": 2})["result"]["session_id"]
        assert server.sessions.get(own).kind.value == "ws"
        with connect(url) as refused:
            frame = json.loads(refused.recv(timeout=10))
            assert frame["error"]["code"] == -32000 and frame["error"]["data"] == {"active_sessions": 1,
                                                                                  "max_sessions": 1}
    wait_until(lambda: server.sessions.active == 0, what="WS /mcp session freed")
