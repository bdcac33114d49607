"""Plain HTTP routes (PROTOCOL.md §1) and what `openenv validate --url` checks."""

from __future__ import annotations

import httpx

from coding_agent_env.models import RolloutRequest


def test_health_metadata_openapi(http: httpx.Client) -> None:
    assert http.get("/health").json() == {"status": "healthy"}
    meta = http.get("/metadata").json()
    assert meta["name"] == "coding_agent_env" and isinstance(meta["description"], str)
    openapi = http.get("/openapi.json").json()
    assert openapi["info"]["version"].startswith("1.")
    paths = set(openapi["paths"])
    assert {"/reset", "/step", "/state"} <= paths  # simulation mode: all three or none


def test_schema_has_action_observation_state(http: httpx.Client) -> None:
    schema = http.get("/schema").json()
    for key in ("action", "observation", "state", "reset_observation"):
        assert isinstance(schema[key], dict)
    assert "tool_name" in schema["action"]["properties"]
    assert {"rollouts_completed", "last_reward", "last_status"} <= set(schema["state"]["properties"])


def test_reset_step_state_are_stateless(http: httpx.Client) -> None:
    assert http.post("/reset", json={"seed": 1}).json() == {"observation": {}, "reward": None, "done": False}
    assert http.post("/reset", json={"seed": -1}).status_code == 422
    state = http.get("/state").json()
    assert state["step_count"] == 0 and state["episode_id"] is None


def test_step_list_tools_and_bad_actions(http: httpx.Client) -> None:
    body = http.post("/step", json={"action": {"type": "list_tools"}}).json()
    [tool] = body["observation"]["tools"]
    assert tool["name"] == "run_rollout"
    assert tool["input_schema"] == RolloutRequest.model_json_schema()
    bad = http.post("/step", json={"action": {"type": "call_tool"}})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["tool_name"]
    assert http.post("/step", json={}).status_code == 422
    assert http.post("/step", json={"action": {}, "timeout_s": 0}).status_code == 422


def test_step_call_tool_runs_a_rollout(http: httpx.Client, oracle_task: dict) -> None:
    body = http.post("/step", json={"action": {"type": "call_tool", "tool_name": "run_rollout", "arguments": oracle_task}})
    observation = body.json()["observation"]
    assert observation["error"] is None
    assert observation["result"]["data"]["status"] == "completed"
    assert body.json()["reward"] == 1.0


def test_get_mcp_is_405_and_validate_probe(http: httpx.Client) -> None:
    assert http.get("/mcp").status_code == 405
    probe = http.post("/mcp", json={})
    assert probe.status_code == 200 and probe.json()["jsonrpc"] == "2.0"
    root = http.get("/")  # the web tab (issue 7): / redirects to /web/
    assert root.status_code == 307 and root.headers["location"] == "/web/"
