"""`coding-agent-env rollout` and `check` as a user runs them: a real subprocess, real sandbox."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from coding_agent_env.settings import Settings
from tests.helpers import uid_pool

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, stdin: str | None = None, settings: Settings, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STATE_DIR": str(settings.state_dir), "SANDBOX_UID_BASE": str(uid_pool(settings).start),
           **extra}
    return subprocess.run(
        [sys.executable, "-m", "coding_agent_env.cli", *args], input=stdin, capture_output=True, text=True, env=env, timeout=120, cwd=ROOT
    )


def test_rollout_summary_and_json(settings: Settings) -> None:
    done = cli("rollout", "examples/binary_search.yaml", settings=settings)
    assert done.returncode == 0, done.stderr
    assert "status=completed  reward=1.000" in done.stdout
    done = cli("rollout", "-", "--json", stdin='{"instruction": "x", "agent": "nop", "verify": ["false"]}', settings=settings)
    assert done.returncode == 0 and json.loads(done.stdout)["reward"] == 0.0


@pytest.mark.parametrize(
    ("task", "stdin", "message"),
    [
        ("missing.yaml", None, "cannot read task"),
        ("-", "{not: [valid", "not valid JSON or YAML"),
        ("-", "- a list", "must be a mapping"),
        ("-", '{"instruction": ""}', "instruction"),
        ("-", '{"instruction": "x", "agent": "sudo"}', "agent"),
        ("-", '{"instruction": "x", "files": {"../x": ""}}', "'..'"),
    ],
)
def test_invalid_input_is_one_line_and_exit_2(settings: Settings, task: str, stdin: str | None, message: str) -> None:
    done = cli("rollout", task, stdin=stdin, settings=settings)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and message in done.stderr and "Traceback" not in done.stderr


def test_check_reports_backends_and_agents(settings: Settings) -> None:
    done = cli("check", settings=settings)
    report = json.loads(done.stdout)
    assert done.returncode == 0 and report["backends"]["local"]["available"] and "oracle" in report["agents"]
    assert "warning" not in report["backends"]["local"]


def test_check_warns_when_isolation_is_off_and_says_how_to_fix_a_refusal(settings: Settings) -> None:
    off = json.loads(cli("check", settings=settings, LOCAL_ISOLATION="none").stdout)["backends"]["local"]
    assert off["available"] and off["isolation"] == "none" and "isolation is off" in off["warning"]
    # bubblewrap broken: the Landlock tier takes over (the refusal where no tier works: tests/unit/test_landlock.py)
    fallback = json.loads(cli("check", settings=settings, BWRAP_PATH="/bin/false").stdout)["backends"]["local"]
    assert fallback["available"] and fallback["isolation"] == "landlock" and "warning" not in fallback
    broken = json.loads(cli("check", settings=settings, BWRAP_PATH="/bin/false",
                            LOCAL_ISOLATION="bwrap").stdout)["backends"]["local"]
    assert not broken["available"] and "LOCAL_ISOLATION=bwrap" in broken["detail"]


def test_gate_subcommand_reaches_the_gate(settings: Settings) -> None:
    done = cli("gate", "--help", settings=settings)
    assert done.returncode == 0 and "usage:" in done.stdout and "gate" in done.stdout


def test_agents_list_takes_the_agents_to_show(settings: Settings, tmp_path: Path) -> None:
    """`agents list NAME ...` reports just those (the image checks its AGENTS build argument this way): exit 0 only
    when each is installed; an unknown name is refused naming the known ones."""
    empty = str(tmp_path / "agents")
    done = cli("agents", "list", "opencode", "pi", settings=settings, AGENTS_DIR=empty)
    shown = json.loads(done.stdout)["agents"]
    assert [a["name"] for a in shown] == ["opencode", "pi"]
    assert done.returncode == 1 and not any(a["installed"] for a in shown)  # nothing in an empty agents dir
    assert json.loads(cli("agents", "list", settings=settings, AGENTS_DIR=empty).stdout)["agents"][2:]  # all
    unknown = cli("agents", "list", "opencod", settings=settings, AGENTS_DIR=empty)
    assert unknown.returncode != 0 and "unknown agent(s) opencod" in unknown.stderr and "known: " in unknown.stderr
