"""The caller token (INTEGRITY 39): with API_TOKEN set, every door that runs or reads anything refuses a request
without it (401, a JSON `detail`), refuses a wrong one, and accepts it as `Authorization: Bearer` or
`X-API-Token`; `/health`, `/metadata` and `/schema` stay open; the relay's public route keeps its own tokens;
the token is never logged. Real uvicorn on loopback, the official MCP client, this project's client."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from mcp import Client
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from coding_agent_env.api.caller_auth import MISSING, WRONG
from coding_agent_env.client import CodingAgentEnv
from coding_agent_env.models import RolloutResult
from tests.protocol.live import ORACLE_TASK, LiveServer

TOKEN = "tok-5f0e9a1c2b7d4e"
WRONG_TOKEN = "tok-5f0e9a1c2b7d4f"  # differs in the last character only
JSONRPC_LIST = {"jsonrpc": "2.0", "method": "tools/list", "id": 1}

DOORS: list[tuple[str, str, dict[str, Any]]] = [
    ("POST", "/reset", {"json": {}}),
    ("POST", "/step", {"json": {"action": {"type": "list_tools"}}}),
    ("GET", "/state", {}),
    ("POST", "/mcp", {"json": JSONRPC_LIST}),
    ("GET", "/list_environments", {}),
    ("GET", "/coding_agent_env/splits", {}),
    ("POST", "/coding_agent_env/num_tasks", {"json": {}}),
    ("POST", "/images", {"content": b"not a tar", "headers": {"Content-Type": "application/x-tar"}}),
    ("GET", "/metrics", {}),
    ("GET", "/no-such-route", {}),
]


@pytest.fixture
def guarded(make_live: Callable[..., LiveServer]) -> LiveServer:
    return make_live(api_token=TOKEN, enable_web_interface=False)


def send(server: LiveServer, method: str, path: str, options: dict[str, Any], **headers: str) -> httpx.Response:
    merged = {**options.get("headers", {}), **headers}
    rest = {k: v for k, v in options.items() if k != "headers"}
    return httpx.request(method, f"{server.http}{path}", headers=merged, timeout=30, **rest)


@pytest.mark.parametrize(("method", "path", "options"), DOORS, ids=[f"{m} {p}" for m, p, _ in DOORS])
def test_each_door_refuses_without_the_token_and_opens_with_it(
    guarded: LiveServer, method: str, path: str, options: dict[str, Any]
) -> None:
    missing = send(guarded, method, path, options)
    assert missing.status_code == 401 and missing.json() == {"detail": MISSING}
    assert missing.headers["www-authenticate"] == "Bearer"
    for wrong in ({"Authorization": f"Bearer {WRONG_TOKEN}"}, {"X-API-Token": WRONG_TOKEN},
                  {"Authorization": TOKEN}):  # not a bearer credential
        refused = send(guarded, method, path, options, **wrong)
        assert refused.status_code == 401, wrong
        assert refused.json()["detail"] in (WRONG, MISSING) and TOKEN not in refused.text
    for right in ({"Authorization": f"Bearer {TOKEN}"}, {"authorization": f"bearer {TOKEN}"},
                  {"X-API-Token": TOKEN}, {"Authorization": f"Bearer hf_the_gateways", "X-API-Token": TOKEN}):
        answered = send(guarded, method, path, options, **right)
        assert answered.status_code != 401, (right, answered.text)


@pytest.mark.parametrize("path", ["/health", "/metadata", "/schema", "/health/loop"])
def test_health_and_metadata_stay_open(guarded: LiveServer, path: str) -> None:
    assert httpx.get(f"{guarded.http}{path}", timeout=10).status_code == 200


def test_without_a_token_configured_nothing_is_refused(make_live: Callable[..., LiveServer]) -> None:
    server = make_live(enable_web_interface=False)
    assert httpx.get(f"{server.http}/state", timeout=10).status_code == 200


def test_the_relays_public_route_keeps_its_own_tokens(guarded: LiveServer) -> None:
    answer = httpx.post(f"{guarded.http}/llm/v1/chat/completions", json={"model": "m", "messages": []}, timeout=10)
    assert answer.status_code == 401 and answer.json().get("detail") != MISSING  # the relay's refusal, not ours


def test_metrics_keep_their_own_token_when_one_is_set(make_live: Callable[..., LiveServer]) -> None:
    server = make_live(api_token=TOKEN, metrics_token="scrape-me", enable_web_interface=False)
    assert httpx.get(f"{server.http}/metrics", headers={"Authorization": "Bearer scrape-me"}).status_code == 200
    assert httpx.get(f"{server.http}/metrics", headers={"X-API-Token": TOKEN}).status_code == 401


@pytest.mark.parametrize("path", ["/ws", "/mcp"])
async def test_websocket_handshakes_need_the_token(guarded: LiveServer, path: str) -> None:
    url = f"ws://127.0.0.1:{guarded.port}{path}"
    for headers in ({}, {"X-API-Token": WRONG_TOKEN}, {"Authorization": f"Bearer {WRONG_TOKEN}"}):
        with pytest.raises(InvalidStatus) as refused:
            async with connect(url, additional_headers=headers):
                pass
        assert refused.value.response.status_code == 401
        assert refused.value.response.body is not None and b"API_TOKEN" in refused.value.response.body
    for headers in ({"X-API-Token": TOKEN}, {"Authorization": f"Bearer {TOKEN}"}):
        async with connect(url, additional_headers=headers) as ws:
            await ws.send('{"type": "state"}' if path == "/ws" else
                          '{"jsonrpc": "2.0", "method": "tools/list", "id": 1}')
            assert await asyncio.wait_for(ws.recv(), 30)


async def test_official_mcp_client_with_the_header(guarded: LiveServer) -> None:
    http = create_mcp_http_client(headers={"X-API-Token": TOKEN})
    async with http, Client(streamable_http_client(f"{guarded.http}/mcp", http_client=http)) as client:
        assert [tool.name for tool in (await client.list_tools()).tools][0] == "run_rollout"
    bare = create_mcp_http_client()
    with pytest.raises(Exception):  # noqa: PT011,B017 - the SDK reports the 401 as an MCPError in a group
        async with bare, Client(streamable_http_client(f"{guarded.http}/mcp", http_client=bare)) as client:
            await client.list_tools()
    init = {"jsonrpc": "2.0", "method": "initialize", "id": 1, "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
    raw = httpx.post(f"{guarded.http}/mcp", json=init, headers={"accept": "application/json, text/event-stream"})
    assert raw.status_code == 401 and raw.json() == {"detail": MISSING}


async def test_the_projects_client_sends_api_token_from_the_environment(
    guarded: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("API_TOKEN", raising=False)
    with pytest.raises(InvalidStatus):
        async with CodingAgentEnv(guarded.http) as env:
            await env.state()
    monkeypatch.setenv("API_TOKEN", TOKEN)
    async with CodingAgentEnv(guarded.http) as env:
        await env.reset()
        result = await env.run_rollout(**ORACLE_TASK)
    assert isinstance(result, RolloutResult) and result.reward == 1.0


def test_the_token_is_never_logged(guarded: LiveServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    for headers in ({"X-API-Token": TOKEN}, {"Authorization": f"Bearer {TOKEN}"}, {"X-API-Token": WRONG_TOKEN}):
        httpx.post(f"{guarded.http}/reset", json={}, headers=headers, timeout=30)
        httpx.post(f"{guarded.http}/mcp", json=JSONRPC_LIST, headers=headers, timeout=30)
    assert caplog.records, "nothing was logged at all: the check would prove nothing"
    assert TOKEN not in caplog.text and WRONG_TOKEN not in caplog.text
