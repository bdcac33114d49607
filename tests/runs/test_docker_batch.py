"""Harbor tasks on Docker: the image built from environment/ (cached by content hash), /tests shown only for
verify, the oracle and Terminus against the fake LLM."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from coding_agent_env.cli.main import main
from coding_agent_env.settings import Settings
from coding_agent_env.tasks.context import pack
from tests.helpers import wait_until
from tests.backends.conftest import docker_engine, no_leftover_containers  # noqa: F401 (fixtures)
from tests.backends.rootfs import HOST_BINDS, IMAGE
from tests.protocol.live import LiveServer
from tests.runs.test_batch import EXAMPLES, lines
from tests.tasks.harbor_fixtures import REWARD, make_task

pytestmark = pytest.mark.usefixtures("assert_no_leftovers", "no_leftover_containers")


@pytest.fixture
def docker_env(settings: Settings, docker_engine: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:  # noqa: F811
    local = settings.backends[0]
    values = {"STATE_DIR": str(settings.state_dir), "SANDBOX_UID_BASE": str(local.uid_base),  # type: ignore[union-attr]
              "SANDBOX_UID_COUNT": str(local.uid_count), "SANDBOX_BACKENDS": "docker,local",  # type: ignore[union-attr]
              "DOCKER_IMAGE": IMAGE, "DOCKER_HOST_BINDS": ",".join(HOST_BINDS)}
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    return values


@pytest.fixture
def built_images(docker_engine: Any) -> Any:  # noqa: F811
    """Removes the task images a test built."""
    before = {image.id for image in docker_engine.images.list(name="coding-agent-env-task")}
    yield
    for image in docker_engine.images.list(name="coding-agent-env-task"):
        if image.id not in before:
            for tag in image.tags:
                docker_engine.images.remove(tag, force=True)


@pytest.mark.usefixtures("built_images")
def test_harbor_task_image_built_once_and_tests_hidden(tmp_path: Path, docker_env: dict[str, str],
                                                       docker_engine: Any) -> None:  # noqa: F811
    # The image's ENV holds for the agent and for verify (the sandbox starts from it, not from the image's shell).
    solve = 'ls -A /tests/ > seen.txt 2>&1; cp /opt/task/data.txt done.txt; echo "$GREETING" > greeting.txt'
    test_sh = (f'mkdir -p /logs/verifier; grep -q SECRET /tests/hidden.txt && [ "$GREETING" = from-image ] && '
               f"cmp -s done.txt /opt/task/data.txt && echo 1 > {REWARD} || echo 0 > {REWARD}")
    make_task(tmp_path / "tasks", "copies-outside",
              dockerfile=f"FROM {IMAGE}\nCOPY data.txt /opt/task/data.txt\nENV GREETING=from-image\n",
              env_files={"data.txt": "from the image\n"}, solve=solve, test_sh=test_sh,
              extra_tests={"hidden.txt": "SECRET"})
    out = tmp_path / "out.jsonl"
    assert main(["run", str(tmp_path / "tasks"), "--agent", "oracle", "-k", "2", "-n", "2", "--out", str(out),
                 "--no-progress"]) == 0
    records = lines(out)
    assert len(records) == 2
    for record in records:
        result = record["result"]
        assert result["sandbox"] == "docker" and result["isolation"] == "docker", result["error"]
        assert result["reward"] == 1.0, (result["error"], result["verify_results"])
        assert "SECRET" not in result["files"]["seen.txt"] and "hidden" not in result["files"]["seen.txt"]
        assert result["files"]["greeting.txt"] == "from-image\n"
    tags = [tag for image in docker_engine.images.list(name="coding-agent-env-task") for tag in image.tags]
    assert len(tags) == 1  # one build for both attempts


def test_examples_on_docker_with_terminus(tmp_path: Path, docker_env: dict[str, str],
                                         monkeypatch: pytest.MonkeyPatch, built_images: None) -> None:
    from tests.agents.sessions import session, write_file_command
    from tests.fakes.llm import FakeLLM, FakeLLMServer

    # The examples' Dockerfiles name a registry image: run them from the test image instead (offline).
    tasks = tmp_path / "tasks"
    for name in ("hello-file", "word-count"):
        source = EXAMPLES / name
        target = tasks / name
        for path in source.rglob("*"):
            if path.is_file():
                (target / path.relative_to(source)).parent.mkdir(parents=True, exist_ok=True)
                text = path.read_text().replace("python:3.12-slim-bookworm", IMAGE)
                (target / path.relative_to(source)).write_text(text)
    out = tmp_path / "oracle.jsonl"
    assert main(["run", str(tasks), "--agent", "oracle", "--out", str(out), "--no-progress"]) == 0
    assert [rec["result"]["reward"] for rec in lines(out)] == [1.0, 1.0]
    key = "sk-docker-batch-SECRET-42"
    monkeypatch.setenv("BATCH_TEST_KEY", key)
    llm_out = tmp_path / "llm.jsonl"
    with FakeLLMServer(FakeLLM(api_key=key)) as fake:
        fake.app.script = session("terminus", write_file_command("hello.txt", "Hello, world!\n"))
        assert main(["run", str(tasks / "hello-file"), "--agent", "terminus", "--base-url", fake.base_url,
                     "--api-key-env", "BATCH_TEST_KEY", "--model", "fake/coder-1", "--out", str(llm_out),
                     "--no-progress"]) == 0
    (record,) = lines(llm_out)
    assert record["result"]["sandbox"] == "docker" and record["result"]["reward"] == 1.0, record["result"]["error"]
    assert key not in json.dumps(record)


@pytest.fixture
def docker_server(docker_env: dict[str, str]) -> Iterator[Callable[..., LiveServer]]:
    """A live server with the Docker backend (the batch's own settings), image builds as a test asks."""
    started: list[LiveServer] = []

    def start(**overrides: Any) -> LiveServer:
        server = LiveServer(Settings.from_env().model_copy(update={"enable_web_interface": False, **overrides}))
        started.append(server.start())
        return server

    yield start
    for server in started:
        server.stop()


@pytest.mark.usefixtures("built_images")
def test_harbor_task_image_built_by_the_server(tmp_path: Path, docker_server: Callable[..., LiveServer],
                                               docker_engine: Any) -> None:  # noqa: F811
    """`run --server` sends the environment to the server, which builds the image (once) and runs the task."""
    server = docker_server(image_builds=True)
    test_sh = (f'mkdir -p /logs/verifier; [ "$(cat /opt/task/data.txt)" = served ] && echo 1 > {REWARD} '
               f"|| echo 0 > {REWARD}")
    make_task(tmp_path / "tasks", "served", dockerfile=f"FROM {IMAGE}\nCOPY data.txt /opt/task/data.txt\n",
              env_files={"data.txt": "served\n"}, test_sh=test_sh)
    out = tmp_path / "out.jsonl"
    assert main(["run", str(tmp_path / "tasks"), "--agent", "oracle", "--sandbox", "docker", "-k", "2", "-n", "2",
                 "--server", server.http, "--out", str(out), "--no-progress"]) == 0
    records = lines(out)
    assert len(records) == 2
    for record in records:
        result = record["result"]
        assert result["sandbox"] == "docker" and result["reward"] == 1.0, (result["error"], result["verify_results"])
    tags = [tag for image in docker_engine.images.list(name="coding-agent-env-task") for tag in image.tags]
    assert len(tags) == 1


def test_the_server_refuses_builds_unless_allowed_and_bad_contexts(
    tmp_path: Path, docker_server: Callable[..., LiveServer], capsys: pytest.CaptureFixture[str]
) -> None:
    make_task(tmp_path / "tasks", "needs-build", dockerfile=f"FROM {IMAGE}\nRUN true\n")
    off = docker_server()
    out = tmp_path / "out.jsonl"
    assert main(["run", str(tmp_path / "tasks"), "--agent", "oracle", "--sandbox", "docker", "--server", off.http,
                 "--out", str(out), "--no-progress"]) == 1
    assert not out.exists() or not lines(out)  # refused, not run and not scored
    err = capsys.readouterr().err
    assert "needs-build" in err and "IMAGE_BUILDS=true" in err and "403" in err

    on = docker_server(image_builds=True, image_build_max_mb=1)
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM {IMAGE}\n")
    with httpx.Client(base_url=on.http, timeout=30) as http:
        too_big = http.post("/images", content=b"\0" * ((1 << 20) + 1))
        assert too_big.status_code == 413 and "IMAGE_BUILD_MAX_MB" in too_big.json()["error"]["message"]
        garbage = http.post("/images", content=b"not a tar")
        assert garbage.status_code == 400 and "not a readable tar" in garbage.json()["error"]["message"]
        (context / "Dockerfile").unlink()
        (context / "x.txt").write_text("x")
        empty = http.post("/images", content=pack(context))
        assert empty.status_code == 400 and "no Dockerfile" in empty.json()["error"]["message"]
        (context / "Dockerfile").write_text("FROM coding-agent-env-no-such-base:1\n")  # never pulled
        failed = http.post("/images", content=pack(context))
        assert failed.status_code == 422, failed.text
    # Nothing of the contexts is left on the server (each is removed once its request is answered).
    wait_until(lambda: not any((on.settings.state_dir / "builds").iterdir()), what="the contexts removed")
