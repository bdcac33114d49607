"""OpenEnv 0.10's Task API: our server (`coding-agent-env serve --tasks`, a subprocess) answers every route as
openenv 0.10's own server does for the same tasks (`task_api_reference.py`, openenv's `create_fastapi_app` in the
released package's virtualenv): the same status codes and bodies over plain HTTP. (openenv 0.10's only client
code for the Task API is its Harbor client, whose paths are fixed to `/harbor_env/...`.)

Where openenv leaves the answer to the environment (an unknown split: openenv's own server turns the
environment's error into a bare 500) ours is a 404 naming the split: compared separately.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.compat.conftest import launch_server
from tests.helpers import free_port, serving, wait_until

ENV = "coding_agent_env"
HERE = Path(__file__).parent
ROOT = HERE.parents[1]


@pytest.fixture(scope="module")
def task_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("taskset")
    lines = [{"instruction": f"Write {n} into n.txt.", "verify": [f"grep -qx {n} n.txt"], "setup": ["true"],
              "split": "train" if n < 3 else "test"} for n in range(5)]
    (root / "numbers.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return root


@pytest.fixture(scope="module")
def ours(task_files: Path) -> Iterator[str]:
    args = ("--tasks", str(task_files / "numbers.jsonl"), f"harbor={ROOT / 'examples' / 'tasks'}")
    with launch_server(task_files, args=args) as url:
        yield url


@pytest.fixture(scope="module")
def reference(ours: str, gen_b: Path, task_files: Path) -> Iterator[str]:
    """openenv's server with our task set's public views (read from ours)."""
    splits = httpx.get(f"{ours}/{ENV}/splits").json()
    data = {"splits": splits, "tasks": {s["name"]: httpx.post(f"{ours}/{ENV}/tasks", json={"split": s["name"]}).json()["tasks"]
                                        for s in splits}}
    (task_files / "reference.json").write_text(json.dumps(data))
    port = free_port()
    log = task_files / "reference.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen([str(gen_b), str(HERE / "task_api_reference.py"), str(port), ENV,
                                 str(task_files / "reference.json")], start_new_session=True,
                                stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(serving(f"{url}/list_environments", proc, log=log.read_text), "openenv's server to start",
                   timeout_s=60)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)


REQUESTS: list[tuple[str, str, Any]] = [
    ("GET", "/list_environments", None),
    ("GET", f"/{ENV}/splits", None),
    ("GET", "/CODING_AGENT_ENV/splits", None),
    ("GET", "/other_env/splits", None),
    ("POST", f"/{ENV}/tasks", {"split": "train"}),
    ("POST", f"/{ENV}/tasks", {"split": "harbor"}),
    ("POST", f"/{ENV}/num_tasks", {"split": "test"}),
    ("POST", f"/{ENV}/num_tasks", {"split": "harbor"}),
    ("POST", f"/{ENV}/task", {"split": "train", "index": 2}),
    ("POST", f"/{ENV}/task", {"split": "harbor", "index": 0}),
    ("POST", f"/{ENV}/task", {"split": "train", "index": 3}),
    ("POST", f"/{ENV}/task", {"split": "train", "index": -1}),
    ("POST", f"/{ENV}/task_range", {"split": "harbor", "start": 2, "stop": 5}),
    ("POST", f"/{ENV}/task_range", {"split": "harbor", "start": -2}),
    ("POST", f"/{ENV}/task_range", {"split": "train"}),
    ("POST", f"/other_env/task", {"split": "train", "index": 0}),
    ("POST", f"/{ENV}/task", {"split": "train"}),
    ("POST", f"/{ENV}/task", {"split": "train", "index": 0, "extra": 1}),
    ("POST", f"/{ENV}/num_tasks", {}),
]


def _answer(response: httpx.Response) -> tuple[int, Any]:
    body = response.json()
    if response.status_code == 422:  # FastAPI's validation errors: compare what failed, not pydantic's wording
        body = sorted((e["type"], tuple(e["loc"])) for e in body["detail"])
    return response.status_code, body


@pytest.mark.parametrize(("method", "path", "body"), REQUESTS, ids=[f"{m} {p} {b}" for m, p, b in REQUESTS])
def test_same_answer_as_openenvs_server(ours: str, reference: str, method: str, path: str, body: Any) -> None:
    mine = _answer(httpx.request(method, ours + path, json=body))
    theirs = _answer(httpx.request(method, reference + path, json=body))
    assert mine == theirs


def test_task_api_shows_only_the_public_part(ours: str) -> None:
    """Instruction, id, index, split (and step names): never setup, verify, files or a solution."""
    tasks = httpx.post(f"{ours}/{ENV}/tasks", json={"split": "harbor"}).json()["tasks"]
    assert tasks and all(set(task) <= {"id", "index", "split", "instruction", "steps"} for task in tasks)
    assert any("steps" in task for task in tasks)  # examples/tasks/two-step
    text = json.dumps(httpx.post(f"{ours}/{ENV}/tasks", json={"split": "train"}).json())
    assert "grep -qx" not in text and "setup" not in text


def test_an_unknown_split_is_named(ours: str, reference: str) -> None:
    mine = httpx.post(f"{ours}/{ENV}/num_tasks", json={"split": "nope"})
    assert mine.status_code == 404 and "unknown split 'nope'" in mine.json()["detail"]
    assert "'train'" in mine.json()["detail"]
    assert httpx.post(f"{reference}/{ENV}/num_tasks", json={"split": "nope"}).status_code == 500


def test_openenvs_released_client_runs_task_i_by_split_and_index(ours: str, gen_b: Path) -> None:
    """openenv 0.10's `MCPToolClient`: `reset(split="test", index=1)` over its WebSocket starts task 1 of the test
    split, and the episode ends with that task's reward (its verify: `grep -qx 4 n.txt`)."""
    done = subprocess.run([str(gen_b), str(HERE / "drivers.py"), "task-set-episode", ours], capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["opened_done"] is False
    assert (out["final"]["status"], out["final"]["reward"]) == ("completed", 1.0), out["final"]


def test_tasks_pages_with_limit_and_cursor(ours: str) -> None:
    """Ours beside openenv's answer: `limit` pages the list, `next_cursor` carries on, null on the last page;
    the pages put together are the whole answer (which a request without `limit` still gets)."""
    whole = httpx.post(f"{ours}/{ENV}/tasks", json={"split": "harbor"}).json()
    assert "next_cursor" not in whole and len(whole["tasks"]) > 2
    pages, cursor = [], None
    while True:
        page = httpx.post(f"{ours}/{ENV}/tasks", json={"split": "harbor", "limit": 2,
                                                      **({"cursor": cursor} if cursor else {})}).json()
        assert len(page["tasks"]) <= 2 and page["env_name"] == ENV
        pages.append(page["tasks"])
        if (cursor := page["next_cursor"]) is None:
            break
    assert [task for page in pages for task in page] == whole["tasks"]
    assert len(pages) == -(-len(whole["tasks"]) // 2)


@pytest.mark.parametrize(("body", "code"), [
    ({"limit": 0}, 422), ({"limit": 10_001}, 422), ({"limit": 2, "cursor": "x"}, 400),
    ({"limit": 2, "cursor": "0"}, 400), ({"limit": 2, "cursor": "999"}, 400), ({"limit": 2, "cursor": "-1"}, 400),
])
def test_a_bad_page_is_refused(ours: str, body: dict[str, Any], code: int) -> None:
    answer = httpx.post(f"{ours}/{ENV}/tasks", json={"split": "harbor", **body})
    assert answer.status_code == code, answer.text
    if code == 400:
        assert answer.json() == {"detail": "Invalid cursor"}
