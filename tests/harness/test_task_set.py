"""A server's task set (`serve --tasks`, `tasks.catalog`) run by naming its tasks: WS `reset(split=, index=)` and
`reset(split=, seed=)` episodes (through `CodingEnvironment` rows, as a trainer sends them), `run_rollout` with
split/index, and the refusals, on a real server with the local bubblewrap backend.

Each task i of the JSONL set is verified by its own file (`touch t<i>` passes task i only), so a reward says which
task ran: an episode of index i ends with task i's reward, and a seed maps to task `seed mod n` for every member
of a group.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from websockets.sync.client import connect

from coding_agent_env.harness import CodingEnvironment
from coding_agent_env.tasks.catalog import CatalogSourceError, TaskCatalog
from tests.helpers import wait_until
from tests.protocol.live import LiveServer
from tests.protocol.test_ws import ask, call

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"
N = 3


@pytest.fixture
def task_set(tmp_path: Path) -> Path:
    path = tmp_path / "set.jsonl"
    lines = [{"instruction": f"Create the file t{i}.", "verify": [f"test -f t{i}"], "task_id": f"touch-{i}"}
             for i in range(N)]
    lines.append({"instruction": "Held out.", "verify": ["true"], "split": "test"})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.fixture
def server(make_live: Callable[..., LiveServer], task_set: Path) -> LiveServer:
    return make_live(tasks=(str(task_set), f"harbor={EXAMPLES / 'hello-file'}"))


def solve(env: CodingEnvironment, row: dict[str, Any], touch: int) -> float | None:
    env.reset(**row)
    env.terminal(f"touch t{touch}")
    return env.get_reward()


def test_an_episode_of_index_i_ends_with_task_is_reward(server: LiveServer) -> None:
    with CodingEnvironment(server.http) as env:
        opening = env.reset(prompt="ignored", split="train", index=1)
        assert opening.startswith("Create the file t1.")
        assert env.report is not None and env.report["status"] == "running"
        env.terminal("touch t1")
        assert env.get_reward() == 1.0
        assert solve(env, {"split": "train", "index": 2}, touch=1) == 0.0  # task 2 is not solved by t1
        assert solve(env, {"task_id": "touch-0"}, touch=0) == 1.0  # an id names a task too
    wait_until(lambda: server.sessions.active == 0, "the session to close")


def test_a_group_seed_maps_every_member_to_the_same_task(server: LiveServer) -> None:
    """TRL's async GRPO passes `seed=group_id`: members with the same seed get task `seed mod n`."""
    with CodingEnvironment(server.http, split="train") as first, CodingEnvironment(server.http, split="train") as second:
        for seed in (0, 4, 8):
            texts = {first.reset(seed=seed), second.reset(seed=seed)}
            assert texts == {f"Create the file t{seed % N}.\n\nSetup: none."}
        first.terminal(f"touch t{8 % N}")
        assert first.get_reward() == 1.0


def test_refusals_are_text_and_the_session_goes_on(server: LiveServer) -> None:
    with CodingEnvironment(server.http) as env:
        assert "out of range" in env.reset(split="train", index=N)
        assert "unknown split 'nope'" in env.reset(split="nope", index=0)
        assert "without task fields" in env.reset(split="train", index=0, instruction="mine")
        assert "no task with id" in env.reset(task_id="missing")
        assert env.reset(split="test", index=0) == "Held out.\n\nSetup: none."


def test_run_rollout_runs_a_task_of_the_set(server: LiveServer) -> None:
    """A Harbor task of the set as a rollout: its own solution by the oracle agent, verified by its own tests."""
    with connect(server.ws) as ws:
        reply = ask(ws, call({"split": "harbor", "index": 0, "agent": "oracle"}))["data"]
        result = reply["observation"]["result"]["data"]
        assert result["status"] == "completed" and result["reward"] == 1.0, result.get("error")
        refused = ask(ws, call({"split": "harbor", "index": 0, "agent": "oracle", "verify": ["true"]}))["data"]
        assert "without task fields" in refused["observation"]["error"]["message"]


def test_without_a_task_set_naming_one_is_refused(make_live: Callable[..., LiveServer]) -> None:
    server = make_live()
    with CodingEnvironment(server.http) as env:
        assert "no task set" in env.reset(split="train", index=0)


def test_a_missing_source_stops_startup(tmp_path: Path) -> None:
    with pytest.raises(CatalogSourceError, match="no such file"):
        TaskCatalog.load([str(tmp_path / "absent.jsonl")])
    (tmp_path / "bad.jsonl").write_text("{}\n")
    with pytest.raises(CatalogSourceError, match="no task loaded"):
        TaskCatalog.load([str(tmp_path / "bad.jsonl")])


def test_a_directory_of_splits(tmp_path: Path) -> None:
    """`set/<split>/<task>/task.toml`: each child a split; `NAME=PATH` names one explicitly."""
    for split, tasks in (("train", ("hello-file", "word-count")), ("test", ("fizzbuzz",))):
        for task in tasks:
            shutil.copytree(EXAMPLES / task, tmp_path / "set" / split / task)
    catalog = TaskCatalog.load([str(tmp_path / "set"), f"extra={tmp_path / 'set' / 'test'}"])
    assert catalog.splits() == [{"name": "test", "type": "test", "num_tasks": 1},
                                {"name": "train", "type": "train", "num_tasks": 2},
                                {"name": "extra", "type": "validation", "num_tasks": 1}]
    assert [task.index for task in catalog.tasks("train")] == [0, 1]


def test_a_split_alone_asks_the_sampler_which_learns_from_outcomes(make_live: Callable[..., LiveServer],
                                                                   task_set: Path) -> None:
    """`reset(split=)` with neither index nor seed: the split's sampler chooses (here `sequential`: each task in
    turn), and every verified episode of a task of the set reaches it."""
    server = make_live(tasks=(str(task_set),), task_sampler="sequential")
    with CodingEnvironment(server.http) as env:
        assert [env.reset(split="train") for _ in range(N + 1)] == [
            f"Create the file t{i % N}.\n\nSetup: none." for i in range(N + 1)]
        env.terminal("touch t0")
        assert env.get_reward() == 1.0
    catalog = server.app.state.sessions.catalog
    assert catalog.samplers["train"].state_dict()["next"] == 1
    curriculum = make_live(tasks=(str(task_set),), task_sampler="curriculum", task_sampler_group_size=4)
    with CodingEnvironment(curriculum.http) as env:
        assert solve(env, {"split": "train", "index": 0}, touch=0) == 1.0
    stats = curriculum.app.state.sessions.catalog.samplers["train"].state_dict()["stats"]
    assert stats["touch-0"][:2] == [1, 1]  # one scored attempt, passed
