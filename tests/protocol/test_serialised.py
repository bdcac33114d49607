"""A result is serialised once per reply: the JSON text a tool's result was turned into (`content[0].text`) is what
goes out as its `data` and `structured_content`, on every OpenEnv door (WS, JSON-RPC, HTTP `/step`)."""

from __future__ import annotations

import json
from typing import Any

import httpx
from websockets.sync.client import connect

from coding_agent_env.api.protocols.shapes import dumps
from coding_agent_env.api.tools import Serialised
from tests.protocol.live import LiveServer


def test_dumps_writes_a_serialised_text_as_it_is_and_nothing_else() -> None:
    result = Serialised('{"b":[1,2.5e-07,"\\u00e9"],"a":null}')
    lookalike = "serialised:00:0"  # the placeholder's shape, without its nonce: only a string
    out = dumps({"data": result, "again": result, "text": lookalike, "n": [1, {"x": "é"}]})
    assert out.count(result.text) == 2
    parsed = {"b": [1, 2.5e-07, "é"], "a": None}
    assert json.loads(out) == {"data": parsed, "again": parsed, "text": lookalike, "n": [1, {"x": "é"}]}


def test_a_serialised_result_reads_as_the_mapping_it_states() -> None:
    result = Serialised('{"reward":1.0,"files":{"a.txt":"hi"}}')
    assert result["reward"] == 1.0 and dict(result) == {"reward": 1.0, "files": {"a.txt": "hi"}}
    assert result == {"reward": 1.0, "files": {"a.txt": "hi"}} and len(result) == 2


def assert_sent_once(raw: str, result: dict[str, Any]) -> None:
    text = result["content"][0]["text"]
    assert json.loads(text) == result["data"] == result["structured_content"]
    assert raw.count(text) == 2  # data and structured_content: the very text, not the result encoded again


def test_each_door_sends_the_text_it_serialised(server: LiveServer, oracle_task: dict[str, Any]) -> None:
    with connect(server.ws) as ws:
        action = {"type": "call_tool", "tool_name": "run_rollout", "arguments": oracle_task}
        ws.send(json.dumps({"type": "step", "data": action}))
        raw = ws.recv(timeout=60)
        assert isinstance(raw, str)
        assert_sent_once(raw, json.loads(raw)["data"]["observation"]["result"])
    with httpx.Client(base_url=server.http, timeout=60) as http:
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "run_rollout", "arguments": oracle_task}}
        reply = http.post("/mcp", json=body)
        assert_sent_once(reply.text, reply.json()["result"])
        step = http.post("/step", json={"action": action})
        assert step.status_code == 200 and step.headers["content-type"] == "application/json"
        assert_sent_once(step.text, step.json()["observation"]["result"])
