"""`coding-agent-env run --server` sends the caller token from API_TOKEN (INTEGRITY 39): against a server that
requires one, a run with it passes and a run without it is refused, naming the 401. Real server subprocess."""


from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from coding_agent_env.cli.main import main
from coding_agent_env.settings import Settings
from tests.helpers import free_port, serving, wait_until

ROOT = Path(__file__).resolve().parents[2]
TASK = ROOT / "examples" / "binary_search.yaml"
TOKEN = "run-server-token-6d3a"


@pytest.fixture
def guarded(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    local = settings.backends[0]
    env = {"STATE_DIR": str(settings.state_dir), "SANDBOX_UID_BASE": str(local.uid_base),  # type: ignore[union-attr]
           "SANDBOX_UID_COUNT": str(local.uid_count), "ENABLE_WEB_INTERFACE": "false",  # type: ignore[union-attr]
           "API_TOKEN": TOKEN, "PYTHONPATH": str(ROOT)}
    monkeypatch.setenv("STATE_DIR", env["STATE_DIR"])
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "coding_agent_env.cli", "serve", "--port", str(port)],
                              env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        wait_until(serving(f"http://127.0.0.1:{port}/health", server), "the server to come up", timeout_s=60,
                   interval_s=0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def test_run_server_sends_api_token(guarded: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.jsonl"
    monkeypatch.delenv("API_TOKEN", raising=False)
    # Refused, not run: no rollout record, the reason names the 401 and the way out, and the run exits 1.
    code = main(["run", str(TASK), "--agent", "oracle", "--server", guarded, "--out", str(out), "--no-progress"])
    printed = capsys.readouterr().out
    assert code == 1, printed
    assert not out.exists() or out.read_text() == ""
    assert f"server {guarded} refused this caller (401): set API_TOKEN" in printed
    assert "exit status 1: 1 refused (1 task never ran)" in printed
    out.unlink()
    monkeypatch.setenv("API_TOKEN", TOKEN)
    assert main(["run", str(TASK), "--agent", "oracle", "--server", guarded, "--out", str(out), "--no-progress"]) == 0
    [record] = [json.loads(line) for line in out.read_text().splitlines()]
    assert record["result"]["reward"] == 1.0
    assert TOKEN not in capsys.readouterr().err + out.read_text()
