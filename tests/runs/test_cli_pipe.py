"""A reader that closes the pipe early (`coding-agent-env runs list | head`) ends the command quietly: status 141
(what a shell reports for a C tool killed by SIGPIPE), nothing on stderr. On main `runs list` died with a
BrokenPipeError traceback. Real processes and a real pipe: the error only exists at the file-descriptor level."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from coding_agent_env.cli.main import EXIT_BROKEN_PIPE
from coding_agent_env.models import RolloutResult, RolloutStatus
from coding_agent_env.runs.journal import Record
from coding_agent_env.runs.store import ResultsStore

ROWS = 1500
"""Enough rows that the listing (about 100 bytes a row) overflows a pipe's 64 KiB buffer whatever the timing."""
DEADLINE_S = 60


@pytest.fixture(scope="module")
def full_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pipe") / "r.sqlite"
    with ResultsStore(str(path)) as store:
        run = store.new_run("batch", "many")
        for n in range(ROWS):
            result = RolloutResult(rollout_id=f"r{n}", task_id=f"task-{n}", agent="oracle", sandbox="local",
                                   status=RolloutStatus.COMPLETED, reward=1.0)
            store.add(run, Record(f"task-{n}", 1, result))
    return path


@pytest.mark.parametrize("action", [["runs", "list", "--limit", str(ROWS)], ["runs", "export"]], ids=" ".join)
def test_a_closed_pipe_ends_the_command_quietly(full_store: Path, action: list[str]) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "coding_agent_env.cli", *action, "--results-db", str(full_store)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    with proc.stderr:
        try:
            assert proc.stdout.readline()  # the reader takes a line, as `head -1` does, and goes away
            proc.stdout.close()
            status = proc.wait(timeout=DEADLINE_S)
            stderr = proc.stderr.read().decode()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr and "Exception ignored" not in stderr, stderr
    assert status == EXIT_BROKEN_PIPE, (status, stderr)


def test_a_reader_that_reads_everything_still_gets_status_0(full_store: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "coding_agent_env.cli", "runs", "list", "--limit", str(ROWS),
                           "--results-db", str(full_store)], capture_output=True, timeout=DEADLINE_S, check=False)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.decode().splitlines()) == ROWS
