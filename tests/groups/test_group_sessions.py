"""Groups through the server: trainer sessions resetting a task of the server's set by its group's seed (as TRL's
async GRPO passes `seed=group_id`) share one setup, as do `run_rollout` calls naming a `group_id`; on a real
server with the local bubblewrap backend (as root: forks)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from coding_agent_env.harness import CodingEnvironment
from tests.protocol.live import LiveServer

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="forking local sandboxes needs a root server")

SETUP = "echo $RANDOM$RANDOM$RANDOM > stamp && mkdir -p pkg && for i in $(seq 50); do echo $i > pkg/$i; done"


@pytest.fixture
def server(make_live: Callable[..., LiveServer], tmp_path: Path) -> LiveServer:
    path = tmp_path / "set.jsonl"
    lines = [{"instruction": f"Task {i}.", "setup": [SETUP], "verify": ["test -f pkg/50 && test -f done"],
              "task_id": f"t{i}"} for i in range(2)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return make_live(tasks=(str(path),), group_idle_s=60.0)


def group_of(env: CodingEnvironment) -> dict[str, Any]:
    assert env.report is not None
    group = env.report.get("group")
    assert isinstance(group, dict), env.report
    return group


def test_sessions_of_one_group_seed_share_one_setup(server: LiveServer) -> None:
    with CodingEnvironment(server.http, split="train") as a, CodingEnvironment(server.http, split="train") as b, \
            CodingEnvironment(server.http, split="train") as other:
        a.reset(seed=4)
        b.reset(seed=4)
        other.reset(seed=5)
        groups = [group_of(env) for env in (a, b, other)]
        assert [g["setup"] for g in groups] == ["forked"] * 3
        assert groups[0]["template"] == groups[1]["template"] != groups[2]["template"]
        assert groups[0]["group_id"] == groups[1]["group_id"] != groups[2]["group_id"]
        stamps = [env.terminal("cat stamp") for env in (a, b)]
        assert stamps[0] == stamps[1] and stamps[0].strip()
        a.terminal("touch done")
        assert a.get_reward() == 1.0 and b.get_reward() == 0.0  # b never saw a's write


def test_a_rollout_group_id_is_honoured_by_name(server: LiveServer) -> None:
    with CodingEnvironment(server.http, split="train") as env:
        env.reset(split="train", index=1, group_id="mine")
        assert group_of(env)["group_id"] == "mine"


def test_trainer_rows_of_one_task_share_one_setup_unless_told_not_to(server: LiveServer) -> None:
    """TRL repeats a dataset row for each member of its group: identical inline rows are one group."""
    row = {"instruction": "Inline.", "setup": [SETUP], "verify": ["test -f done"]}
    with CodingEnvironment(server.http) as a, CodingEnvironment(server.http) as b, \
            CodingEnvironment(server.http) as other, CodingEnvironment(server.http, group_rows=False) as alone:
        a.reset(**row)
        b.reset(**row)
        other.reset(**{**row, "instruction": "Another task."})
        alone.reset(**row)
        groups = [group_of(env) for env in (a, b, other)]
        assert groups[0]["template"] == groups[1]["template"] != groups[2]["template"]
        assert a.terminal("cat stamp") == b.terminal("cat stamp") != alone.terminal("cat stamp")
        assert alone.report is not None and alone.report.get("group") is None


def test_each_session_is_a_caller_whose_templates_are_bounded(make_live: Callable[..., LiveServer]) -> None:
    """Issue 42 item 3: templates are bounded per caller, and a session is one (its id reaches the registry): with
    no template allowed per caller, a session's group member sets up on its own and says why."""
    server = make_live(group_max_templates_per_caller=0)
    row = {"instruction": "Inline.", "setup": [SETUP], "verify": ["test -f done"], "group_id": "bounded"}
    with CodingEnvironment(server.http) as env:
        env.reset(**row)
        group = group_of(env)
        assert group["setup"] == "per_member" and "GROUP_MAX_TEMPLATES_PER_CALLER" in group["note"]
        env.terminal("touch done")
        assert env.get_reward() == 1.0
