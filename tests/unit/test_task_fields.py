"""The task fields a Harbor task declares (issue 29): where it runs, who runs it, its steps, validated once in
`models.Task`; and the two multi-step rules (`workspace.steps`: the gate, the task's reward from its steps)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from coding_agent_env.models import Task
from coding_agent_env.models.results import StepResult
from coding_agent_env.workspace.steps import gate, step_reward, step_rewards


def task(**fields: object) -> Task:
    return Task.model_validate({"instruction": "do it", **fields})


@pytest.mark.parametrize("workdir", ["/app", "/srv/app", "/data/x/y", "/app/"])
def test_a_workdir_outside_the_systems_own_directories_is_kept_normalised(workdir: str) -> None:
    assert task(workdir=workdir).workdir == workdir.rstrip("/")


@pytest.mark.parametrize("workdir", ["app", "/", "/usr/src/app", "/etc", "/tmp/x", "/logs", "/tests", "/solution",
                                     "/proc/self", "/home/sandbox", "/opt/agents", "/app/../etc", "/a\x00b"])
def test_a_workdir_in_a_reserved_place_or_malformed_is_refused(workdir: str) -> None:
    with pytest.raises(ValidationError, match="workdir"):
        task(workdir=workdir)


def test_outside_files_claim_their_top_directories_and_may_not_sit_in_the_workdir() -> None:
    claimed = task(workdir="/app", outside_files={"/queries/a.txt": "1", "/data/b/c.txt": "2"})
    assert claimed.writable_roots() == ("/app", "/data", "/queries")
    with pytest.raises(ValidationError, match="inside the workdir"):
        task(workdir="/app", outside_files={"/app/x.txt": "1"})
    with pytest.raises(ValidationError, match="system's or the sandbox's own"):
        task(outside_files={"/etc/passwd": "root::0:0::/:/bin/sh"})


@pytest.mark.parametrize("user", ["root", "nobody", "app-user", "1001", "_svc"])
def test_users_are_names_or_uids(user: str) -> None:
    assert task(agent_user=user, verify_user=user).verify_user == user


@pytest.mark.parametrize("user", ["", "Root", "a b", "x" * 40, "1;id", "-1"])
def test_anything_else_as_a_user_is_refused(user: str) -> None:
    with pytest.raises(ValidationError, match="user"):
        task(verify_user=user)


def test_a_search_path_into_the_declared_workdir_is_refused_as_for_the_workspace() -> None:
    with pytest.raises(ValidationError, match="PATH"):
        task(workdir="/app", env={"PATH": "/app/bin:/usr/bin"})
    assert task(workdir="/app", env={"PATH": "/usr/local/bin:/usr/bin"}).env["PATH"]


def test_a_step_is_the_task_with_the_steps_own_parts() -> None:
    whole = task(workdir="/app", verify_user="root", agent_timeout_s=50, steps=[
        {"name": "one", "instruction": "first", "files": {"a.txt": "1"}, "setup": ["true"], "verify": ["false"],
         "solution": ["echo"], "solution_files": {"solve.sh": "x"}, "agent_timeout_s": 7},
        {"name": "two", "instruction": "second"},
    ])
    first, second = (whole.for_step(step) for step in whole.steps)
    assert (first.instruction, first.files, first.setup, first.verify, first.agent_timeout_s) == (
        "first", {"a.txt": "1"}, ["true"], ["false"], 7)
    assert first.solution_files == {"solve.sh": "x"} and first.steps == []
    assert (first.workdir, first.verify_user) == ("/app", "root")
    assert (second.agent_timeout_s, second.files, second.verify) == (50, {}, [])


def test_step_files_are_confined_like_the_tasks() -> None:
    with pytest.raises(ValidationError, match=r"'\.\.'"):
        task(steps=[{"name": "a", "instruction": "x", "files": {"../escape": "1"}}])


def done(name: str, reward: float | None, rewards: dict[str, float] | None = None) -> StepResult:
    return StepResult(name=name, reward=reward, rewards=rewards)


def test_a_number_gates_the_reward_and_a_mapping_each_named_metric() -> None:
    assert gate(done("a", 1.0), 1.0) is None
    assert "below its min_reward 1" in (gate(done("a", 0.5), 1.0) or "")
    assert "reward none" in (gate(done("a", None), 0.0) or "")  # verify could not score: below any gate
    metrics = done("a", 0.5, {"correctness": 1.0, "style": 0.0})
    assert gate(metrics, {"correctness": 1.0}) is None
    assert "style 0 below" in (gate(metrics, {"style": 0.5}) or "")
    assert "speed none below" in (gate(metrics, {"speed": 0.0}) or "")  # a missing metric fails its gate
    assert gate(done("a", 0.0), None) is None


def test_the_task_reward_is_the_mean_of_verified_steps_or_the_final_one() -> None:
    steps = [done("a", 1.0), done("b", 0.0), done("c", None)]
    assert step_reward(steps, "mean", 3)[0] == 0.5
    assert step_reward(steps, "final", 3)[0] == 0.0
    assert step_reward([done("a", None)], "mean", 2) == (None, None)
    named = [done("a", 1.0, {"x": 1.0, "y": 1.0}), done("b", 0.5, {"x": 0.0})]
    assert step_rewards(named, "mean") == {"x": 0.5, "y": 0.5}
    assert step_rewards(named, "final") == {"x": 0.0}


def test_only_the_oracle_gets_a_solution_root_and_only_hidden_tests_get_tests() -> None:
    """`/solution` is made for the oracle alone (no other agent's sandbox has it); `/tests` only for a task
    whose hidden tests go there; users only when the task names one."""
    from coding_agent_env.sandbox.base import SandboxSpec
    from coding_agent_env.workspace.lifecycle import task_spec

    harbor = task(workdir="/app", solution_files={"solve.sh": "x"}, verify_files_root="/tests",
                  outside_files={"/queries/q.txt": "1"}, verify_user="root")
    base = SandboxSpec(rollout_id="r")
    oracle, other = task_spec(harbor, base, solution=True), task_spec(harbor, base)
    assert oracle.writable_roots == ("/queries", "/solution") and other.writable_roots == ("/queries",)
    assert (other.workdir, other.tests, other.users) == ("/app", True, True)
    plain = task_spec(task(), base)
    assert (plain.workdir, plain.writable_roots, plain.tests, plain.users) == (None, (), False, False)
