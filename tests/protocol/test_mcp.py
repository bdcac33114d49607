"""Real MCP at `/mcp` with the official `mcp` 2.x client (Streamable HTTP), sharing the server's capacity."""

from __future__ import annotations

import json
from typing import Any

import httpx
from mcp import Client

from coding_agent_env.models import RolloutRequest, RolloutResult
from tests.helpers import wait_until
from tests.protocol.live import LiveServer


async def test_official_client_lists_the_tools_and_runs_a_rollout(server: LiveServer, oracle_task: dict) -> None:
    async with Client(f"{server.http}/mcp") as client:
        tools = (await client.list_tools()).tools
        assert [tool.name for tool in tools] == ["run_rollout", "start_episode", "terminal", "keystrokes"]
        schema = tools[0].input_schema
        assert schema["properties"].keys() == RolloutRequest.model_json_schema()["properties"].keys()
        assert schema["properties"]["agent"]["default"] is None  # the server's DEFAULT_AGENT
        assert all(prop.get("description") for prop in schema["properties"].values())
        assert server.sessions.active == 1
        outcome = await client.call_tool("run_rollout", oracle_task)
        assert not outcome.is_error
        result = RolloutResult.model_validate(outcome.structured_content)
        assert result.reward == 1.0 and result.status.value == "completed"
        assert json.loads(outcome.content[0].text) == outcome.structured_content
        bad = await client.call_tool("run_rollout", {"instruction": "x", "agent": "nobody"})
        assert bad.is_error
    wait_until(lambda: server.sessions.active == 0, what="MCP session freed on DELETE")


async def test_mcp_sessions_count_against_capacity(make_server: Any) -> None:
    server = make_server(max_concurrent_envs=1)
    body = {"jsonrpc": "2.0", "method": "openenv/session/create", "id": 1}
    session_id = httpx.post(f"{server.http}/mcp", json=body).json()["result"]["session_id"]
    init = {"jsonrpc": "2.0", "method": "initialize", "id": 9, "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
    refused = httpx.post(f"{server.http}/mcp", json=init, headers={"accept": "application/json, text/event-stream"})
    assert refused.status_code == 200
    assert refused.json()["error"]["code"] == -32000 and refused.json()["error"]["data"]["max_sessions"] == 1
    close = {"jsonrpc": "2.0", "method": "openenv/session/close", "params": {"session_id": session_id}, "id": 2}
    httpx.post(f"{server.http}/mcp", json=close)
    async with Client(f"{server.http}/mcp") as client:
        assert len((await client.list_tools()).tools) == 4


def test_unknown_mcp_session_is_404(server: LiveServer) -> None:
    response = httpx.post(f"{server.http}/mcp", json={"jsonrpc": "2.0", "method": "tools/list", "id": 1},
                          headers={"mcp-session-id": "not-ours"})
    assert response.status_code == 404


def test_idle_mcp_sessions_are_reaped(make_server: Any) -> None:
    server = make_server(session_idle_timeout_s=1.5, session_reap_interval_s=0.05)  # seconds: a loaded machine pauses
    init = {"jsonrpc": "2.0", "method": "initialize", "id": 1, "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
    headers = {"accept": "application/json, text/event-stream"}
    response = httpx.post(f"{server.http}/mcp", json=init, headers=headers)
    mcp_id = response.headers["mcp-session-id"]
    assert server.sessions.active == 1
    wait_until(lambda: server.sessions.active == 0, what="idle MCP session reaped")
    ping = {"jsonrpc": "2.0", "method": "tools/list", "id": 2}
    gone = httpx.post(f"{server.http}/mcp", json=ping, headers={**headers, "mcp-session-id": mcp_id})
    assert gone.status_code == 404
