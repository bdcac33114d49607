"""`GET /metrics` on a real server (uvicorn in a thread, the local bubblewrap backend): known rollouts over the WS
step path, an interactive episode, Task API calls and an image build request, then the scrape parsed with prometheus_client's own parser
and every count checked exactly; the token, the switch, and that no label value is an id."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.sync.client import ClientConnection, connect

from coding_agent_env.observe.metrics import CONTENT_TYPE_LATEST, LIMIT_KINDS, limit_kind
from coding_agent_env.settings import Settings
from tests.fakes.llm import FakeLLM, FakeLLMServer, Reply
from tests.helpers import wait_until
from tests.protocol.live import ORACLE_TASK, LiveServer
from tests.protocol.test_ws import ask, call

P = "coding_agent_env_"
Key = tuple[str, frozenset[tuple[str, str]]]
SET_TASK_ID = "metrics-set-0"


@pytest.fixture
def task_set(tmp_path: Path) -> Path:
    path = tmp_path / "set.jsonl"
    path.write_text(json.dumps({"instruction": "Create done.", "solution": ["touch done"], "verify": ["test -f done"],
                                "task_id": SET_TASK_ID}) + "\n")
    return path


def scrape(server: LiveServer, **headers: str) -> httpx.Response:
    return httpx.get(f"{server.http}/metrics", headers=headers, timeout=30)


def samples(text: str) -> dict[Key, float]:
    """Every sample of the exposition by (sample name, labels), as prometheus_client's parser reads it."""
    found: dict[Key, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


def value(seen: dict[Key, float], name: str, **labels: str) -> float:
    """One sample's value; 0 when the series does not exist (a counter never incremented)."""
    return seen.get((P + name, frozenset(labels.items())), 0.0)


def total(seen: dict[Key, float], name: str, **labels: str) -> float:
    """The sum of `name` over every series whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (sample, got), v in seen.items() if sample == P + name and want <= got)


def rollout(ws: ClientConnection, arguments: dict[str, Any]) -> dict[str, Any]:
    observation = ask(ws, call(arguments))["data"]["observation"]
    assert observation["error"] is None, observation["error"]
    return observation["result"]["data"]


def terminal(ws: ClientConnection, command: str = "", final_answer: str = "") -> dict[str, Any]:
    arguments = {"command": command, "final_answer": final_answer}
    step = {"type": "call_tool", "tool_name": "terminal", "arguments": arguments}
    data = ask(ws, {"type": "step", "data": step})["data"]
    assert data["observation"]["error"] is None, data["observation"]["error"]
    return data


def test_known_work_is_counted_exactly(make_live: Callable[..., LiveServer], task_set: Path) -> None:
    server = make_live(tasks=(str(task_set),))
    before = samples(scrape(server).text)
    assert value(before, "sessions_capacity") == 8 and total(before, "rollouts_finished_total") == 0
    assert total(before, "group_templates") == 0 and value(before, "group_template_bytes") == 0
    with FakeLLMServer(FakeLLM(api_key="sk-metrics")) as fake:
        fake.app.script = [Reply(content="step", tool_calls=(("terminal", json.dumps({"command": "echo hi"})),)),
                           Reply(status=500, error_message="engine crashed")]
        with connect(server.ws) as ws:
            passing = rollout(ws, ORACLE_TASK)
            failing = rollout(ws, {**ORACLE_TASK, "solution": ["echo no > hello.txt"]})
            limited = rollout(ws, {"instruction": "Fill the disk.", "agent": "oracle", "limits": {"disk_mb": 8},
                                   "solution": ["dd if=/dev/zero of=fill bs=1M count=32 2>/dev/null; true"],
                                   "verify": ["true"]})
            llm = rollout(ws, {"instruction": "Say hi.", "agent": "terminus", "base_url": fake.base_url,
                               "api_key": "sk-metrics", "model": "fake/m", "verify": ["true"], "agent_timeout_s": 60})
            from_set = rollout(ws, {"split": "train", "index": 0, "agent": "oracle"})

            opened = ask(ws, {"type": "reset", "data": {"instruction": "Make a.", "verify": ["test -f a"]}})["data"]
            episode_id = opened["observation"]["episode"]["episode_id"]
            terminal(ws, "touch a")
            terminal(ws, "echo still going")
            during = samples(scrape(server).text)
            final = terminal(ws, final_answer="done")
            assert final["done"] is True and final["reward"] == 1.0
            after_episode = samples(scrape(server).text)

        with httpx.Client(base_url=server.http, timeout=30) as http:
            assert http.get("/list_environments").status_code == 200
            assert http.get("/coding_agent_env/splits").status_code == 200
            assert http.get("/coding_agent_env/splits").status_code == 200
            assert http.post("/coding_agent_env/task", json={"split": "train", "index": 5}).status_code == 400
            assert http.post("/coding_agent_env/num_tasks", json={}).status_code == 422
            assert http.get("/elsewhere/splits").status_code == 404
            assert http.post("/images", content=b"not a context").status_code == 403  # builds are off by default
        wait_until(lambda: server.sessions.active == 0, "the WebSocket's session to close")
    response = scrape(server)
    assert response.status_code == 200 and response.headers["content-type"] == CONTENT_TYPE_LATEST
    seen = samples(response.text)
    results = [passing, failing, limited, llm, from_set]

    # The rollouts: what each was known to be, then counted by status, agent and backend.
    assert (passing["status"], passing["reward"]) == ("completed", 1.0)
    assert (failing["status"], failing["reward"]) == ("completed", 0.0)
    assert [limit_kind(hit) for hit in limited["limits_hit"]] == ["disk"], limited["limits_hit"]
    assert llm["error_detail"]["type"] == "LlmUpstreamError", llm["error"]
    assert (from_set["task_id"], from_set["reward"]) == (SET_TASK_ID, 1.0)
    assert value(seen, "rollouts_finished_total", status="completed", agent="oracle", backend="local") == 4
    assert value(seen, "rollouts_finished_total", status=llm["status"], agent="terminus", backend="local") == 1
    assert total(seen, "rollouts_finished_total") == 5
    for phase in ("provision", "setup", "agent", "verify", "collect", "teardown", "total"):
        assert value(seen, "rollout_phase_seconds_count", phase=phase) == 5, phase
    assert value(seen, "rollout_phase_seconds_sum", phase="total") == pytest.approx(
        sum(r["timings"]["total_s"] for r in results))
    scored_adhoc = [r["reward"] for r in results if r["reward"] is not None and r is not from_set]
    assert value(seen, "rollout_reward_count", task_set="adhoc") == len(scored_adhoc)
    assert value(seen, "rollout_reward_sum", task_set="adhoc") == pytest.approx(sum(scored_adhoc))
    assert value(seen, "rollout_reward_count", task_set="train") == 1
    assert value(seen, "rollout_reward_bucket", task_set="train", le="0.9") == 0  # the 1.0 is in the last bucket
    assert value(seen, "limits_hit_total", kind="disk") == 1 and total(seen, "limits_hit_total") == 1
    assert value(seen, "sandbox_creations_total", backend="local") == 5
    assert total(seen, "sandbox_creation_failures_total") == 0

    # The relay's calls, from the LLM rollout's turns: one answered, then the 500 the agent did not get past.
    turns = llm["proxy_turns"]
    classes = [t["upstream_status"] // 100 for t in turns]
    assert classes[0] == 2 and classes[-1] == 5, classes
    assert total(seen, "relay_calls_total") == len(turns)
    assert total(seen, "relay_calls_total", status_class="2xx") == classes.count(2)
    assert total(seen, "relay_calls_total", status_class="5xx") == classes.count(5)
    assert total(seen, "relay_calls_total", dialect="chat") == len(turns)
    assert total(seen, "relay_call_seconds_count") == len(turns)
    prompt = sum((t["usage"] or {}).get("prompt_tokens") or 0 for t in turns)
    completion = sum((t["usage"] or {}).get("completion_tokens") or 0 for t in turns)
    assert prompt > 0 and completion > 0
    assert total(seen, "relay_prompt_tokens_total") == prompt
    assert total(seen, "relay_completion_tokens_total") == completion

    # The episode: live while it ran, its two commands and its final answer, one completed end.
    assert value(during, "episodes_live") == 1 and value(during, "sessions_live", kind="ws") == 1
    assert value(after_episode, "episodes_live") == 0
    assert value(seen, "episode_calls_total", call="terminal") == 2
    assert value(seen, "episode_calls_total", call="final_answer") == 1
    assert total(seen, "episode_call_failures_total") == 0
    assert value(seen, "episode_call_seconds_count", call="terminal") == 2
    assert value(seen, "episodes_finished_total", status="completed") == 1
    assert total(seen, "episodes_finished_total") == 1
    assert value(seen, "sessions_live", kind="ws") == 0 and value(seen, "episodes_live") == 0

    # The Task API, by route template and status.
    assert value(seen, "task_api_requests_total", route="/list_environments", code="200") == 1
    assert value(seen, "task_api_requests_total", route="/{env}/splits", code="200") == 2
    assert value(seen, "task_api_requests_total", route="/{env}/task", code="400") == 1
    assert value(seen, "task_api_requests_total", route="/{env}/num_tasks", code="422") == 1
    assert value(seen, "task_api_requests_total", route="/{env}/splits", code="404") == 1
    assert total(seen, "task_api_requests_total") == 6
    assert value(seen, "image_build_requests_total", outcome="disabled") == 1
    assert total(seen, "image_build_requests_total") == 1

    # No label value is an id (rollout, task, episode, sandbox) or free text: every one is from a closed set.
    ids = {episode_id, SET_TASK_ID, *(r["rollout_id"] for r in results), *(r["sandbox_id"] for r in results)}
    values = {v for (_, labels) in seen for k, v in labels if k != "le"}
    assert not any(i in v for i in ids for v in values)
    routes = {v for (_, labels) in seen for k, v in labels if k == "route"}
    assert routes == {"/list_environments", "/{env}/splits", "/{env}/task", "/{env}/num_tasks"}
    assert values - routes <= CLOSED_LABEL_VALUES, values - routes - CLOSED_LABEL_VALUES
    assert all(float(v) >= 0 for (_, labels) in seen for k, v in labels if k == "le")  # bounds: numbers, +Inf


CLOSED_LABEL_VALUES = {
    "completed", "agent_failed", "agent_timeout", "setup_failed", "infra_error", "cancelled", "expired", "other",
    "oracle", "terminus", "local", "adhoc", "train", *LIMIT_KINDS, "2xx", "4xx", "5xx", "error", "chat", "vllm",
    "sglang", "llamacpp", "openai", "unknown", "ws", "http", "mcp", "ui", "terminal", "keystrokes", "final_answer",
    "provision", "setup", "agent", "verify", "collect", "teardown", "total", "200", "400", "404", "422", "disabled",
    "in_use", "idle",
}
"""Every label value the known work may produce (besides the Task API's route templates and histogram bounds)."""


def test_a_token_guards_the_metrics(make_live: Callable[..., LiveServer]) -> None:
    server = make_live(metrics_token="s3cret-metrics-token")
    assert scrape(server).status_code == 401
    assert scrape(server, Authorization="Bearer wrong").status_code == 401
    assert scrape(server, Authorization="Basic s3cret-metrics-token").status_code == 401
    allowed = scrape(server, Authorization="Bearer s3cret-metrics-token")
    assert allowed.status_code == 200 and "s3cret" not in allowed.text
    assert value(samples(allowed.text), "sessions_capacity") == 8


def test_metrics_switched_off_answer_404(make_live: Callable[..., LiveServer]) -> None:
    server = make_live(metrics_enabled=False)
    assert scrape(server).status_code == 404
    assert httpx.get(f"{server.http}/health", timeout=30).status_code == 200


def test_each_app_has_its_own_registry(make_live: Callable[..., LiveServer]) -> None:
    first, second = make_live(), make_live(max_concurrent_envs=3)
    with connect(first.ws) as ws:
        rollout(ws, ORACLE_TASK)
    wait_until(lambda: first.sessions.active == 0, "the WebSocket's session to close")
    seen_first, seen_second = samples(scrape(first).text), samples(scrape(second).text)
    assert total(seen_first, "rollouts_finished_total") == 1 and total(seen_second, "rollouts_finished_total") == 0
    assert value(seen_first, "sessions_capacity") == 8 and value(seen_second, "sessions_capacity") == 3


def test_values_outside_the_closed_sets_are_other_and_failures_are_counted() -> None:
    """What the live run cannot easily produce: a provision failure, an unanswered call, a native dialect, an
    agent, backend, engine or task set the server does not know (none of them becomes a label of its own)."""
    from coding_agent_env.models import ErrorInfo, RolloutResult, RolloutStatus, Turn, Usage
    from coding_agent_env.observe.metrics import ServerMetrics, limit_kind, status_class

    metrics = ServerMetrics(backends=["local"], task_sets=["train"])
    turns = [Turn(turn=0, upstream_status=None, error="upstream unreachable", engine="mystery-engine"),
             Turn(turn=1, upstream_status=429, passthrough="anthropic", engine="vllm",
                  usage=Usage(prompt_tokens=7, completion_tokens=None), completion_token_ids=[1, 2, 3])]
    failed = RolloutResult(rollout_id="r-123", task_id="t-9", agent="someone-elses-agent", sandbox="elsewhere",
                           status=RolloutStatus.INFRA_ERROR, proxy_turns=turns,
                           limits_hit=["out of memory: 512 MB", "something new"],
                           error_detail=ErrorInfo(type="SandboxError", stage="provision", message="no room"))
    metrics.rollout_finished(failed, task_set="a-split-it-never-had")
    metrics.rollout_finished(failed.model_copy(update={"status": RolloutStatus.COMPLETED, "reward": 0.5}),
                             task_set="a-split-it-never-had")
    metrics.episode_finished("a-status-from-the-future")
    metrics.episode_call("terminal", 0.2, failed=True)
    seen = samples(metrics.exposition().decode())
    assert value(seen, "rollouts_finished_total", status="infra_error", agent="other", backend="other") == 1
    assert value(seen, "sandbox_creation_failures_total", backend="other") == 1
    assert value(seen, "rollout_reward_count", task_set="other") == 1
    assert value(seen, "limits_hit_total", kind="memory") == 2 and value(seen, "limits_hit_total", kind="other") == 2
    assert value(seen, "relay_calls_total", dialect="chat", engine="other", status_class="error") == 2
    assert value(seen, "relay_calls_total", dialect="anthropic", engine="vllm", status_class="4xx") == 2
    assert value(seen, "relay_prompt_tokens_total", engine="vllm") == 14  # usage, twice
    assert value(seen, "relay_completion_tokens_total", engine="vllm") == 6  # no usage figure: the token ids
    assert value(seen, "episodes_finished_total", status="other") == 1
    assert value(seen, "episode_call_failures_total", call="terminal") == 1
    from coding_agent_env.models import GroupReport

    forked = GroupReport(group_id="g", setup="forked", made_here=True, fork_s=0.004)
    for group in (forked, forked.model_copy(update={"made_here": False}), GroupReport(group_id="g", setup="per_member")):
        metrics.rollout_finished(failed.model_copy(update={"group": group}))
    seen = samples(metrics.exposition().decode())
    assert value(seen, "group_members_total", setup="forked", made_template="true") == 1
    assert value(seen, "group_members_total", setup="forked", made_template="false") == 1
    assert value(seen, "group_members_total", setup="per_member", made_template="false") == 1
    assert value(seen, "group_fork_seconds_count") == 2
    assert [limit_kind(t) for t in ("process limit reached", "disk quota exceeded", "cpu time", "file size")] == [
        "pids", "disk", "cpu", "fsize"]
    assert [status_class(s) for s in (200, 302, 404, 503, None)] == ["2xx", "error", "4xx", "5xx", "error"]
    text = metrics.exposition().decode()
    assert not any(word in text for word in ("r-123", "t-9", "someone-elses", "elsewhere", "mystery", "never-had"))
