"""The Runs view in a real browser: a batch's rollouts listed, filtered, and one opened with its commands and
files; and the server keeping its own rollouts when RESULTS_FROM_SERVER is on."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from playwright.sync_api import expect

from coding_agent_env.runs.store import ResultsStore
from tests.helpers import serving, wait_until
from tests.ui.conftest import UiServer

pytestmark = pytest.mark.ui

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"


def _uid_range() -> dict[str, str]:
    """A sandbox uid range of this test's own (suites may run side by side)."""
    return {"SANDBOX_UID_BASE": str(300_000 + secrets.randbelow(20_000) * 64), "SANDBOX_UID_COUNT": "64"}


def test_runs_view_lists_filters_and_opens_a_rollout(page, ui_server: UiServer, tmp_path: Path) -> None:  # noqa: ANN001
    # A batch writes the store the server reads (its STATE_DIR's); in a process of its own, since Playwright's
    # sync API holds this thread's event loop.
    out = tmp_path / "out.jsonl"
    env = {**os.environ, "STATE_DIR": str(ui_server.state_dir), **_uid_range()}
    argv = [sys.executable, "-m", "coding_agent_env.cli", "run", str(EXAMPLES), "--agent", "oracle", "--out", str(out),
            "--no-progress"]
    subprocess.run(argv, env=env, check=True, capture_output=True, timeout=300)
    fizz = next(json.loads(line) for line in out.read_text().splitlines() if json.loads(line)["task_id"] == "fizzbuzz")
    page.goto(ui_server.url + "/web/")
    page.get_by_role("tab", name="Runs").click()
    page.locator("#runs-refresh").click()
    table = page.locator("#runs-rollouts")
    expect(table).to_contain_text("hello-file")
    expect(table).to_contain_text("word-count")
    for chart in ("pass", "rewards", "phases", "throughput"):  # drawn by the browser, from this batch's rollouts
        expect(page.locator(f"#runs-chart-{chart} canvas, #runs-chart-{chart} svg").first).to_be_visible()
    expect(page.locator("#runs-chart-pass")).to_contain_text("fizzbuzz")
    expect(page.locator("#runs-tasks")).to_contain_text("signal")  # the curriculum's view of each task
    expect(page.locator("#runs-tasks")).to_contain_text("word-count")
    page.locator("#runs-task textarea").fill("fizz")
    page.locator("#runs-min-reward textarea").fill("1")
    page.locator("#runs-refresh").click()
    expect(page.locator("#runs-note")).to_contain_text("1 rollouts shown")
    expect(table).not_to_contain_text("hello-file")
    page.locator("#runs-rollout-id textarea").fill(fizz["result"]["rollout_id"])
    page.locator("#runs-open").click()
    expect(page.locator("#runs-verdict")).to_contain_text(re.compile("PASS"))
    expect(page.locator("#runs-verify")).to_contain_text("bash /tests/test.sh")
    page.get_by_role("tab", name="Files").last.click()
    expect(page.locator("#runs-files")).to_contain_text("fizzbuzz.py")
    expect(page.locator("#runs-timings")).to_contain_text("verify")


def test_the_server_keeps_its_rollouts_by_setting(tmp_path: Path) -> None:
    from coding_agent_env.client import CodingAgentEnv

    db = tmp_path / "server.sqlite"
    state = Path(tempfile.mkdtemp(prefix="cae-ui-"))
    os.chmod(state, 0o711)  # not under tmp_path (0700): sandbox uids traverse to their roots
    server = UiServer(state, tmp_path / "server.log", RESULTS_FROM_SERVER="true", RESULTS_DB=str(db),
                      ENABLE_WEB_INTERFACE="false", **_uid_range())
    try:
        wait_until(serving(server.url + "/health", server.proc, (tmp_path / "server.log").read_text, timeout_s=1),
                   "the server to come up", timeout_s=60, interval_s=0.05)
        with CodingAgentEnv(server.url).sync() as env:
            env.reset()
            result = env.run_rollout(instruction="x", agent="oracle", solution=["echo hi > a"], verify=["test -f a"],
                                     task_id="kept")
    finally:
        server.stop()
        shutil.rmtree(state, ignore_errors=True)
    with ResultsStore(db) as store:
        (row,) = store.rollouts()
        assert row.rollout_id == result.rollout_id and row.task_id == "kept" and row.reward == 1.0
        assert store.runs()[0].origin == "server"
