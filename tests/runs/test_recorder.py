"""The server's recorder (`RESULTS_FROM_SERVER`): a result the store does not take is kept aside (appended under a
lock: servers may share the file), and a store whose run could not be opened is opened anew, never written to
under no run. Real SQLite, real `flock`."""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
from pathlib import Path

from coding_agent_env.models import RolloutResult, RolloutStatus
from coding_agent_env.runs.journal import Record, append_record, read_records
from coding_agent_env.runs.recorder import UNSTORED_FILE, ServerRecorder
from coding_agent_env.runs.store import ResultsStore
from coding_agent_env.settings import Settings
from tests.helpers import poll, wait_until


def result(rollout_id: str) -> RolloutResult:
    return RolloutResult(rollout_id=rollout_id, task_id="t", agent="oracle", sandbox="local",
                         status=RolloutStatus.COMPLETED, reward=1.0)


async def test_a_run_the_store_refused_to_open_is_opened_again_not_skipped(tmp_path: Path) -> None:
    """The first result finds the store refusing the server's run (here a trigger; in life a lock held past the
    busy timeout): that result is kept aside. The next, once the store takes runs again, is stored under a run the
    store lists, never under an empty run id."""
    db = tmp_path / "results.sqlite"
    with ResultsStore(db):
        pass
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TRIGGER refuse BEFORE INSERT ON runs BEGIN SELECT RAISE(ABORT, 'no runs now'); END")
    settings = Settings.from_env({"RESULTS_DB": str(db), "STATE_DIR": str(tmp_path / "state")})
    recorder = ServerRecorder(settings)
    try:
        recorder(result("first"))
        await poll(lambda: (tmp_path / "state" / UNSTORED_FILE).exists(), "the first result kept aside")
        with sqlite3.connect(db) as conn:
            conn.execute("DROP TRIGGER refuse")
        recorder(result("second"))
    finally:
        await recorder.aclose()
    (kept,) = read_records(tmp_path / "state" / UNSTORED_FILE)
    assert kept.result.rollout_id == "first"
    with ResultsStore(db) as store:
        (row,) = store.rollouts()
        assert row.rollout_id == "second" and row.run_id in {run.run_id for run in store.runs()}


def test_a_run_is_opened_even_when_retention_fails_then(tmp_path: Path) -> None:
    """Opening a run applies retention after the run is stored; a retention pass the database refuses (here a
    trigger; in life a lock held past the busy timeout) is logged, not the run's failure: a caller that took it for
    one would open another (an empty run left behind each time) or give up on a store that holds its run."""
    db = tmp_path / "results.sqlite"
    with ResultsStore(db) as store:
        store.add(store.new_run("batch"), Record("t", 1, result("old")))
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TRIGGER keep BEFORE DELETE ON rollouts BEGIN SELECT RAISE(ABORT, 'kept'); END")
    with ResultsStore(db, max_rollouts=0, max_age_days=1e-9) as store:
        run = store.new_run("batch")
        assert run in {row.run_id for row in store.runs()} and len(store.rollouts()) == 1


def test_an_append_to_the_unstored_file_waits_for_another_writers_lock(tmp_path: Path) -> None:
    """Servers sharing a STATE_DIR append to one unstored file; each cuts a torn last line first. Cut and append
    happen under an exclusive `flock` of the file, so one server's cut never takes a line another is writing: here
    another writer holds the lock, with half a line written, and the append waits for it (then the line is whole)."""
    path = tmp_path / UNSTORED_FILE
    appended = threading.Event()
    with path.open("a", encoding="utf-8") as other:
        fcntl.flock(other.fileno(), fcntl.LOCK_EX)
        other.write('{"task_id": "t", "attem')
        other.flush()
        writer = threading.Thread(target=lambda: (append_record(path, Record("t", 2, result("mine"))),
                                                  appended.set()))
        writer.start()
        try:
            wait_until(lambda: appended.is_set() or _waits_for_lock(path), "the append to wait for the lock, or end")
            assert not appended.is_set(), "appended (and cut) while another writer held the file"
            other.write('pt": 1, "source": "", "notes": [], "result": ' + result("theirs").model_dump_json() + "}\n")
            other.flush()
        finally:
            fcntl.flock(other.fileno(), fcntl.LOCK_UN)
        writer.join(10)
    assert [r.result.rollout_id for r in read_records(path)] == ["theirs", "mine"]


def _waits_for_lock(path: Path) -> bool:
    """Whether a process waits for a lock of `path`'s file (a `->` line of /proc/locks names its inode)."""
    inode = f":{os.stat(path).st_ino} "
    return any("->" in line and inode in line for line in Path("/proc/locks").read_text().splitlines())
