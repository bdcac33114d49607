"""Task loading: request files, JSONL (bad lines by number), Harbor directories and their bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coding_agent_env.sandbox.base import SandboxLimits
from coding_agent_env.tasks import LoadedTask, TaskError, TaskOptions, iter_tasks
from tests.tasks.harbor_fixtures import make_task

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"


def test_request_files_yaml_and_json(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("instruction: do it\nverify: ['true']\ntask_id: a\n")
    (tmp_path / "b.json").write_text(json.dumps({"instruction": "x", "agent": "nobody"}))
    first, second = iter_tasks([tmp_path / "a.yaml", tmp_path / "b.json"])
    assert isinstance(first, LoadedTask) and first.task_id == "a" and first.request.verify == ["true"]
    assert isinstance(second, TaskError) and "agent" in second.message and str(tmp_path / "b.json") == second.source


def test_jsonl_bad_lines_by_number_rest_go_on(tmp_path: Path) -> None:
    lines = [json.dumps({"instruction": "one", "task_id": "t1"}), "{not json", "", json.dumps([1, 2]),
             json.dumps({"instruction": "four", "api_key": "sk-secret-value", "base_url": 5}),
             json.dumps({"instruction": "five", "task_id": "t5"})]
    path = tmp_path / "set.jsonl"
    path.write_text("\n".join(lines) + "\n")
    items = list(iter_tasks([path]))
    kinds = [type(item).__name__ for item in items]
    assert kinds == ["LoadedTask", "TaskError", "TaskError", "TaskError", "LoadedTask"]
    assert [item.source for item in items if isinstance(item, TaskError)] == [f"{path}:2", f"{path}:4", f"{path}:5"]
    assert all("sk-secret-value" not in item.message for item in items if isinstance(item, TaskError))
    assert [item.task_id for item in items if isinstance(item, LoadedTask)] == ["t1", "t5"]


def test_harbor_mapping(tmp_path: Path) -> None:
    toml = ('[task]\nname = "org/named"\n[agent]\ntimeout_sec = 90\n[verifier]\ntimeout_sec = 45\n'
            '[environment]\ncpus = 64\nmemory_mb = 512\nallow_internet = true\n')
    task = make_task(tmp_path, "dir-name", toml=toml,
                     dockerfile="FROM x\nWORKDIR /app\nCOPY src/ /app/src/\nCOPY top.txt .\nENV A=1\n"
                                "ENV PATH=/opt/t/bin:$PATH B=\"two ${A}\"\nENV HOME /root\n",
                     env_files={"src/m.py": "M = 1\n", "top.txt": "top\n", "unused.txt": "no\n"},
                     extra_tests={"test_x.py": "assert True\n"})
    caps = SandboxLimits(memory_mb=4096, disk_mb=1024, max_processes=256, cpus=2, max_file_mb=64, cpu_s=600)
    (loaded,) = iter_tasks([task], TaskOptions(caps=caps))
    assert isinstance(loaded, LoadedTask), loaded
    request = loaded.request
    assert request.task_id == "org/named"
    assert request.agent_timeout_s == 90 and request.command_timeout_s == 45
    assert request.limits is not None and request.limits.cpus == 2 and request.limits.memory_mb == 512
    assert request.files == {"src/m.py": "M = 1\n", "top.txt": "top\n"}
    assert set(request.verify_files) == {"test.sh", "test_x.py"} and request.verify_files_root == "/tests"
    assert request.verify == ["bash /tests/test.sh"] and request.reward_file_required
    # The whole solution/ is the oracle's /solution, where solve.sh runs; the workdir is the Dockerfile's.
    assert request.solution == ["bash /solution/solve.sh"] and "echo ok > done.txt" in request.solution_files["solve.sh"]
    assert request.workdir == "/app" and (request.agent_user, request.verify_user) == ("root", "root")
    notes = " | ".join(loaded.notes)
    assert "cpus 64 cut" in notes and "internet access not honoured" in notes
    # ENV becomes the request's env, expanded as Docker would; HOME is the sandbox's own, so it is left (and noted).
    assert request.env == {"A": "1", "PATH": "/opt/t/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                           "B": "two 1"}
    assert "Dockerfile ENV not set on local: HOME" in notes


def test_harbor_directory_of_tasks_and_bad_input(tmp_path: Path) -> None:
    make_task(tmp_path, "a-good")
    make_task(tmp_path, "b-bad-toml", toml="[agent\ntimeout_sec = ")
    make_task(tmp_path, "c-no-instruction", instruction=None)
    make_task(tmp_path, "d-runs", dockerfile="FROM x\nRUN apt-get install -y jq\n")
    bad = tmp_path / "e-no-toml"
    (bad / "tests").mkdir(parents=True)
    items = {Path(item.source).name: item for item in iter_tasks([tmp_path])}
    assert isinstance(items["a-good"], LoadedTask) and items["a-good"].task_id == "a-good"
    assert isinstance(items["b-bad-toml"], TaskError) and "malformed task.toml" in items["b-bad-toml"].message
    missing = items["c-no-instruction"]
    assert isinstance(missing, TaskError) and "instruction.md is missing" in missing.message
    refused = items["d-runs"]
    assert isinstance(refused, TaskError) and refused.unsupported
    assert "--sandbox docker" in refused.message and "RUN (line 2)" in refused.message
    assert isinstance(items["e-no-toml"], TaskError) and "task.toml is missing" in items["e-no-toml"].message
    (ignored,) = iter_tasks([tmp_path / "d-runs"], TaskOptions(ignore_dockerfile=True))
    assert isinstance(ignored, LoadedTask) and any("skipped" in note for note in ignored.notes)
    (on_docker,) = iter_tasks([tmp_path / "d-runs"], TaskOptions(sandbox="docker"))
    assert isinstance(on_docker, LoadedTask) and on_docker.environment is not None
    assert on_docker.environment.tag.startswith("coding-agent-env-task:")


def test_content_hash_follows_environment(tmp_path: Path) -> None:
    task = make_task(tmp_path, "t", env_files={"a.txt": "1"})
    (first,) = iter_tasks([task], TaskOptions(sandbox="docker"))
    (task / "environment" / "a.txt").write_text("2")
    (second,) = iter_tasks([task], TaskOptions(sandbox="docker"))
    assert isinstance(first, LoadedTask) and isinstance(second, LoadedTask)
    assert first.environment and second.environment and first.environment.tag != second.environment.tag


def test_examples_load() -> None:
    items = list(iter_tasks([EXAMPLES]))
    assert len(items) >= 4 and all(isinstance(item, LoadedTask) for item in items), items


def test_copies_outside_the_workdir_need_docker(tmp_path: Path) -> None:
    task = make_task(tmp_path, "t", dockerfile="FROM x\nCOPY data.txt /opt/data.txt\n", env_files={"data.txt": "d"})
    (local,) = iter_tasks([task])
    assert isinstance(local, TaskError) and local.unsupported and "--sandbox docker" in local.message
    (docker,) = iter_tasks([task], TaskOptions(sandbox="docker"))
    assert isinstance(docker, LoadedTask) and docker.request.files == {}  # the image holds it


def test_harbor_declarations_reach_the_task(tmp_path: Path) -> None:
    """What a task declares (issue 29) becomes task fields: the workdir (task.toml over WORKDIR), users (the
    task's, else the Dockerfile's USER, else root), COPYs outside the workdir at their paths, literal env values,
    steps with their own tests over the task's, the task's solution where a step has none."""
    toml = ('multi_step_reward_strategy = "final"\n[agent]\nuser = "app"\n[environment]\nworkdir = "/srv/w"\n'
            'env = { LITERAL = "yes", FROM_HOST = "${HOME}" }\n[verifier]\nenv = { MODE = "strict run" }\n'
            '[solution]\nenv = { HINT = "1" }\n'
            '[[steps]]\nname = "one"\nmin_reward = { correctness = 1.0 }\n[[steps]]\nname = "two"\n')
    task = make_task(tmp_path, "declared", toml=toml, instruction=None,
                     dockerfile="FROM x\nUSER 1001\nCOPY data/ /data/\nCOPY cfg /etc/cfg\nCMD [\"bash\"]\n",
                     env_files={"data/a.txt": "a\n", "cfg": "c\n"}, extra_tests={"shared.py": "S = 1\n"})
    for name, text in {"steps/one/instruction.md": "first", "steps/one/tests/test.sh": "echo one",
                       "steps/one/workdir/setup.sh": "echo set", "steps/two/instruction.md": "second",
                       "steps/two/solution/solve.sh": "echo two"}.items():
        (task / name).parent.mkdir(parents=True, exist_ok=True)
        (task / name).write_text(text)
    (refused,) = iter_tasks([task], TaskOptions())
    assert isinstance(refused, TaskError) and "/etc/cfg" in refused.message and refused.unsupported
    (loaded,) = iter_tasks([task], TaskOptions(ignore_dockerfile=True))
    assert isinstance(loaded, LoadedTask), loaded
    request, notes = loaded.request, " | ".join(loaded.notes)
    assert request.workdir == "/srv/w" and (request.agent_user, request.verify_user) == ("app", "1001")
    assert request.outside_files == {"/data/a.txt": "a\n"} and "/etc/cfg" in notes and "CMD (line 5)" in notes
    assert request.env["LITERAL"] == "yes" and "FROM_HOST" not in request.env and "FROM_HOST" in notes
    assert request.verify == ["MODE='strict run' bash /tests/test.sh"] and request.solution_env == {"HINT": "1"}
    one, two = request.steps
    assert request.instruction == "first" and request.step_reward == "final"
    assert one.verify_files["test.sh"] == "echo one" and one.verify_files["shared.py"] == "S = 1\n"
    assert one.setup == ["bash setup.sh"] and one.min_reward == {"correctness": 1.0}
    assert "echo ok" in one.solution_files["solve.sh"] and two.solution_files["solve.sh"] == "echo two"
    assert two.verify_files["test.sh"] != "echo one"  # the task's own test.sh


def test_an_env_name_that_is_not_a_variable_name_refuses_the_task(tmp_path: Path) -> None:
    """[verifier].env reaches verify's shell command: a name that is not a variable name never does."""
    task = make_task(tmp_path, "inject", toml='[verifier]\nenv = { "A;touch /x;B" = "1" }\n')
    (refused,) = iter_tasks([task], TaskOptions())
    assert isinstance(refused, TaskError) and "not a variable name" in refused.message


@pytest.mark.parametrize("workdir", ["/usr/src/app", "/tmp", "relative"])
def test_a_workdir_no_sandbox_can_show_refuses_the_task(tmp_path: Path, workdir: str) -> None:
    task = make_task(tmp_path, "where", toml=f'[environment]\nworkdir = "{workdir}"\n')
    (refused,) = iter_tasks([task], TaskOptions())
    assert isinstance(refused, TaskError) and "workdir" in refused.message
