"""`coding-agent-env serve` argument handling against a stubbed uvicorn runner (no server started)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from coding_agent_env import serve


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    return parser.parse_args(list(argv))


class StubRunner:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, app: str, **kwargs: Any) -> None:
        self.calls.append((app, kwargs))


def env_dir(tmp_path: Path, manifest: str | None) -> Path:
    directory = tmp_path / "env"
    directory.mkdir()
    if manifest is not None:
        (directory / "openenv.yaml").write_text(manifest)
    return directory


def test_own_app_defaults_to_loopback_8000() -> None:
    runner = StubRunner()
    assert serve.serve(parse(), runner) == 0
    [(app, kwargs)] = runner.calls
    assert app == "coding_agent_env.serve:create_app" and kwargs["factory"] is True
    assert (kwargs["host"], kwargs["port"], kwargs["reload"]) == ("127.0.0.1", 8000, False)
    assert "app_dir" not in kwargs


def test_env_dir_uses_manifest_and_leaves_the_caller_alone(tmp_path: Path) -> None:
    directory = env_dir(tmp_path, "spec_version: 1\nname: x\nruntime: fastapi\napp: server.app:app\nport: 8123\n")
    before = (os.getcwd(), list(sys.path), dict(os.environ))
    runner = StubRunner()
    serve.serve(parse(str(directory), "--reload"), runner)
    assert (os.getcwd(), list(sys.path), dict(os.environ)) == before
    [(app, kwargs)] = runner.calls
    assert app == "server.app:app" and kwargs["app_dir"] == str(directory.resolve())
    assert kwargs["port"] == 8123 and kwargs["reload"] is True and kwargs["reload_dirs"] == [str(directory.resolve())]


def test_port_flag_wins_and_default_port(tmp_path: Path) -> None:
    directory = env_dir(tmp_path, "app: m:app\nport: 8123\n")
    runner = StubRunner()
    serve.serve(parse(str(directory), "--port", "9001", "--host", "::1"), runner)
    assert runner.calls[0][1]["port"] == 9001 and runner.calls[0][1]["host"] == "::1"
    (directory / "openenv.yaml").write_text("app: m:app\n")
    serve.serve(parse(str(directory)), runner)
    assert runner.calls[1][1]["port"] == 8000


def test_all_interfaces_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("API_TOKEN", raising=False)
    serve.serve(parse("--host", "0.0.0.0"), StubRunner())
    err = capsys.readouterr().err
    assert "warning: binding all interfaces" in err and "no API_TOKEN is set" in err
    monkeypatch.setenv("API_TOKEN", "set")
    serve.serve(parse("--host", "0.0.0.0"), StubRunner())
    err = capsys.readouterr().err
    assert "warning: binding all interfaces" in err and "API_TOKEN" not in err


@pytest.mark.parametrize(
    ("manifest", "fragment"),
    [
        (None, "no openenv.yaml"),
        ("app: [unclosed\n", "invalid YAML"),
        ("- a\n- b\n", "must be a mapping"),
        ("name: x\n", "'app' must be 'module:attribute', got None"),
        ("app: 'no_colon'\n", "'app' must be 'module:attribute'"),
        ("app: 'a:b:c'\n", "'app' must be 'module:attribute'"),
        ("app: m:app\nruntime: docker\n", "runtime 'docker' is not supported"),
        ("app: m:app\nport: http\n", "'port' must be an integer in 1-65535"),
        ("app: m:app\nport: 0\n", "'port' must be an integer in 1-65535"),
        ("app: m:app\nport: 70000\n", "'port' must be an integer in 1-65535"),
        ("app: m:app\nport: true\n", "'port' must be an integer in 1-65535"),
    ],
)
def test_bad_manifests_are_one_line_errors(tmp_path: Path, manifest: str | None, fragment: str) -> None:
    directory = env_dir(tmp_path, manifest)
    runner = StubRunner()
    with pytest.raises(serve.ServeError) as failed:
        serve.serve(parse(str(directory)), runner)
    assert fragment in str(failed.value) and "\n" not in str(failed.value)
    assert runner.calls == []


def test_missing_directory_and_bad_port_flag(tmp_path: Path) -> None:
    with pytest.raises(serve.ServeError, match="no such directory"):
        serve.serve(parse(str(tmp_path / "missing")), StubRunner())
    for bad in ("abc", "0", "65536"):
        with pytest.raises(serve.ServeError, match="--port must be an integer"):
            serve.serve(parse("--port", bad), StubRunner())


def test_tasks_flag_becomes_the_tasks_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--tasks` is TASKS in the server's environment (the app factory reads it as any setting); each source must
    exist, a `SPLIT=PATH` too; an OpenEnv directory has no task set of ours."""
    monkeypatch.setenv("TASKS", "")  # recorded: `serve` sets it below, and the test's end restores it
    (tmp_path / "a.jsonl").write_text("{}\n")
    launch = serve.plan(parse("--tasks", str(tmp_path / "a.jsonl"), f"test={tmp_path}"))
    assert launch.environ == {"TASKS": f"{tmp_path / 'a.jsonl'},test={tmp_path}"}
    runner = StubRunner()
    assert serve.serve(parse("--tasks", str(tmp_path / "a.jsonl")), runner) == 0
    assert os.environ["TASKS"] == str(tmp_path / "a.jsonl")
    with pytest.raises(serve.ServeError, match="no such file"):
        serve.plan(parse("--tasks", f"train={tmp_path / 'absent'}"))
    with pytest.raises(serve.ServeError, match="comma"):
        serve.plan(parse("--tasks", f"{tmp_path},x"))
    with pytest.raises(serve.ServeError, match="OpenEnv environment directory"):
        serve.plan(parse(str(env_dir(tmp_path, "app: m:app\n")), "--tasks", str(tmp_path)))
