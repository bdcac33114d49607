"""The results store: filters, export, retention by count and by age, two writers; each test against both kinds
of store (`store_location`: a SQLite file, a real PostgreSQL database)."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest

from coding_agent_env.models import RolloutResult, RolloutStatus
from coding_agent_env.runs.journal import Record
from coding_agent_env.runs.store import Filters, ResultsStore


def record(n: int, reward: float | None, agent: str = "oracle") -> Record:
    status = RolloutStatus.COMPLETED if reward is not None else RolloutStatus.INFRA_ERROR
    result = RolloutResult(rollout_id=f"r{n}", task_id=f"task-{n % 3}", agent=agent, sandbox="local", status=status,
                           reward=reward)
    return Record(f"task-{n % 3}", 1 + n // 3, result, source=f"src/{n}", notes=("a note",))


def test_filters_export_and_show(store_location: str) -> None:
    with ResultsStore(store_location) as store:
        run = store.new_run("batch", "run x")
        for n in range(9):
            store.add(run, record(n, None if n == 4 else n / 8, agent="pi" if n % 2 else "oracle"))
        assert len(store.rollouts()) == 9
        assert {r.task_id for r in store.rollouts(Filters(task="task-1"))} == {"task-1"}
        assert [r.rollout_id for r in store.rollouts(Filters(status="infra_error"))] == ["r4"]
        assert {r.rollout_id for r in store.rollouts(Filters(min_reward=0.75))} == {"r6", "r7", "r8"}
        assert all(r.agent == "pi" for r in store.rollouts(Filters(agent="pi", max_reward=0.5)))
        out = io.StringIO()
        assert store.export(out, Filters(run_id=run)) == 9
        lines = [json.loads(line) for line in out.getvalue().splitlines()]
        assert lines[0]["run_id"] == run and lines[0]["notes"] == ["a note"]
        assert RolloutResult.model_validate(lines[8]["result"]).rollout_id == "r8"
        assert store.result("r3").reward == 3 / 8 and store.result("nope") is None
        (summary,) = store.runs()
        assert summary.rollouts == 9 and summary.description == "run x"


def test_retention_by_count_and_age(store_location: str) -> None:
    path = store_location
    with ResultsStore(path, max_rollouts=5) as store:
        run = store.new_run("batch")
        for n in range(8):
            store.add(run, record(n, 1.0))
        assert store.prune() == 3
        assert sorted(r.rollout_id for r in store.rollouts()) == ["r3", "r4", "r5", "r6", "r7"]
    with ResultsStore(path, max_age_days=1) as store:
        assert store.prune() == 0
        assert store.prune(now=time.time() + 86400 + 60) == 5 and store.rollouts() == [] and store.runs() == []


def test_two_writers_share_the_store(store_location: str) -> None:
    path = store_location
    with ResultsStore(path) as one, ResultsStore(path) as two:
        run_one, run_two = one.new_run("batch"), two.new_run("server")
        for n in range(20):
            (one if n % 2 else two).add(run_one if n % 2 else run_two, record(n, 0.5))
        assert len(one.rollouts()) == 20 and {r.origin for r in two.runs()} == {"batch", "server"}


def test_runs_command_lists_shows_and_exports(store_location: str, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    from coding_agent_env.cli.main import main

    db = store_location
    with ResultsStore(db) as store:
        run = store.new_run("batch", "run demo")
        for n in range(4):
            store.add(run, record(n, n / 4))
    assert main(["runs", "list", "--results-db", str(db), "--min-reward", "0.5"]) == 0
    listed = capsys.readouterr().out
    assert "r2" in listed and "r3" in listed and "r1 " not in listed
    assert main(["runs", "list", "--runs", "--results-db", str(db)]) == 0
    assert "run demo" in capsys.readouterr().out
    assert main(["runs", "show", "r3", "--results-db", str(db)]) == 0
    assert json.loads(capsys.readouterr().out)["reward"] == 0.75
    out = tmp_path / "export.jsonl"
    assert main(["runs", "export", "--results-db", str(db), "--task", "task-0", "-o", str(out)]) == 0
    assert [json.loads(line)["result"]["rollout_id"] for line in out.read_text().splitlines()] == ["r0", "r3"]
    assert main(["runs", "show", "nope", "--results-db", str(db)]) == 2
    assert main(["runs", "list", "--results-db", str(tmp_path / "none.sqlite")]) == 2


def test_tasks_stats_weighs_each_task_as_the_curriculum_does(store_location: str, capsys) -> None:  # noqa: ANN001
    """`coding-agent-env tasks stats`: per task its rollouts, scored attempts, passes, pass rate under the prior,
    signal for a group of G and the curriculum's normalised weight, from the store's outcomes."""
    from coding_agent_env.cli.main import main

    path = store_location
    with ResultsStore(path) as store:
        run = store.new_run("batch")
        for n, (task, reward) in enumerate([("solved", 1.0)] * 4 + [("mixed", 1.0), ("mixed", 0.0)] * 2
                                           + [("broken", None)]):
            result = RolloutResult(rollout_id=f"r{n}", task_id=task, agent="oracle", sandbox="local",
                                   status=RolloutStatus.COMPLETED if reward is not None else RolloutStatus.INFRA_ERROR,
                                   reward=reward, wall_s=2.0)
            store.add(run, Record(task, n, result))
        assert store.task_outcomes() == [("mixed", 4, 4, 2, 8.0), ("solved", 4, 4, 4, 8.0), ("broken", 1, 0, 0, 0.0)]
    assert main(["tasks", "stats", "--results-db", str(path), "--group-size", "4"]) == 0
    lines = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[1:]}
    assert lines["mixed"][1:5] == ["4", "4", "2", "0.50"] and lines["solved"][4] == "0.83"
    weights = {task: float(line[-1]) for task, line in lines.items()}
    assert weights["mixed"] > weights["solved"] and sum(weights.values()) == pytest.approx(1.0, abs=0.002)
    assert lines["broken"][4] == "0.50"  # never scored: the prior's p, worth trying


def test_a_prune_keeps_the_run_another_writer_just_opened(store_location: str) -> None:
    """Retention drops the runs it emptied, not a run opened since (a replica about to write its first row)."""
    with ResultsStore(store_location, max_rollouts=2) as pruner, ResultsStore(store_location) as other:
        old = pruner.new_run("batch")
        for n in range(4):
            pruner.add(old, record(n, 1.0))
        fresh = other.new_run("server")
        assert pruner.prune() == 2
        assert {r.run_id for r in pruner.runs()} == {old, fresh}
        other.add(fresh, record(9, 0.5))
        assert pruner.prune() == 1 and {r.run_id: r.rollouts for r in other.runs()} == {old: 1, fresh: 1}


# -- nothing is lost silently (INTEGRITY 42) --------------------------------------------------------------------

NUL_ID = "nul\x00id"
SURROGATE_ID = "lone\ud800surrogate"  # a Python str may hold one (JSON "\ud800", a file name's undecodable byte)


def _odd(rollout_id: str, task_id: str) -> Record:
    from coding_agent_env.models import CommandResult

    result = RolloutResult(rollout_id=rollout_id, task_id=task_id, agent="oracle", sandbox="local",
                           status=RolloutStatus.COMPLETED, reward=1.0, setup_results=[
                               CommandResult(cmd="printf", exit_code=0, stdout=f"out {task_id}", stderr="",
                                             duration_s=0.1)])
    return Record(task_id, 1, result, source=f"src/{task_id}", notes=(f"note {task_id}",))


def test_text_no_database_holds_verbatim_is_stored_escaped_and_reads_back_exact(store_location: str,
                                                                                    tmp_path: Path) -> None:
    """NUL (PostgreSQL's text refuses it) and a lone surrogate (no UTF-8 database holds one) in a task id, a
    source, a rollout id and the result: each row is stored, and every read (rows, result, export, outcomes, a
    filter on the exact text) gives the exact values back. On main, PostgreSQL refused the NUL row and SQLite
    the surrogate one."""
    odd = {"r-nul\x00": NUL_ID, "r-sur\udcff": SURROGATE_ID, "plain": "plain"}
    with ResultsStore(store_location) as store:
        run = store.new_run("batch", "odd \udcff path")
        for rollout_id, task_id in odd.items():
            store.add(run, _odd(rollout_id, task_id))
        rows = {row.rollout_id: row for row in store.rollouts()}
        assert {rollout_id: row.task_id for rollout_id, row in rows.items()} == odd
        assert rows["r-nul\x00"].source == f"src/{NUL_ID}" and rows["r-sur\udcff"].notes == [f"note {SURROGATE_ID}"]
        for rollout_id, task_id in odd.items():
            result = store.result(rollout_id)
            assert result is not None and result.task_id == task_id
            assert result.setup_results[0].stdout == f"out {task_id}"
        assert [row.task_id for row in store.rollouts(Filters(task="\x00id"))] == [NUL_ID]
        assert {outcome[0] for outcome in store.task_outcomes()} == set(odd.values())
        out = io.StringIO()
        assert store.export(out) == 3
    exported = [json.loads(line) for line in out.getvalue().splitlines()]
    assert sorted(line["task_id"] for line in exported) == sorted(odd.values())
    assert {line["result"]["rollout_id"] for line in exported} == set(odd)
    (tmp_path / "export.jsonl").write_text(out.getvalue(), encoding="utf-8")  # the export is valid UTF-8


def test_a_journal_keeps_a_lone_surrogate_and_nul(tmp_path: Path) -> None:
    """The batch's JSONL (and the server's unstored file) is the first copy: a record holding a lone surrogate is
    written as valid UTF-8 JSON and read back exact. On main, writing it raised UnicodeEncodeError (which stops
    the batch)."""
    from coding_agent_env.runs.journal import Journal, read_records

    journal = Journal(tmp_path / "out.jsonl")
    journal.open()
    try:
        journal.append(_odd("a", SURROGATE_ID))
        journal.append(_odd("b", NUL_ID))
    finally:
        journal.close()
    from coding_agent_env.runs.journal import append_record  # what the server's unstored file is written with

    append_record(tmp_path / "out.jsonl", _odd("c", "plain"))
    (tmp_path / "out.jsonl").read_bytes().decode("utf-8")  # strict: no surrogate bytes in the file
    assert [(r.task_id, r.result.task_id) for r in read_records(tmp_path / "out.jsonl")] == [
        (SURROGATE_ID, SURROGATE_ID), (NUL_ID, NUL_ID), ("plain", "plain")]


def _refuse(location: str, task_id: str) -> None:
    """Make the store refuse rows of `task_id`, as a database policy (a constraint an operator added) would."""
    if location.startswith("postgresql:"):
        import psycopg

        with psycopg.connect(location, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE rollouts ADD CONSTRAINT refuse CHECK (task_id <> '{task_id}')")
        return
    import sqlite3

    with sqlite3.connect(location) as conn:
        conn.execute(f"CREATE TRIGGER refuse BEFORE INSERT ON rollouts WHEN NEW.task_id = '{task_id}' "
                     "BEGIN SELECT RAISE(ABORT, 'refused by policy'); END")
    conn.close()


def test_run_counts_what_the_store_acknowledged_and_exits_3_when_a_row_is_missing(
        store_location: str, tmp_path: Path, settings) -> None:  # noqa: ANN001
    """The real `run` on the local backend with the oracle: three tasks, one with NUL in its id (stored exact),
    one the store refuses: the run names that row, says 2 of 3 stored, exits 3; the journal has all three. On
    main: a traceback, "written to the results store" and exit 0 (and on PostgreSQL the NUL row lost too)."""
    import os
    import subprocess
    import sys

    from coding_agent_env.runs.journal import read_records

    with ResultsStore(store_location):
        pass  # the schema, so the refusal can be added to it
    _refuse(store_location, "refused")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"instruction": "x", "task_id": task_id, "solution": ["echo 1 > f"],
                                         "verify": ["test -f f"]}) + "\n" for task_id in ("plain", NUL_ID, "refused")))
    local = settings.backends[0]
    env = {**os.environ, "STATE_DIR": str(settings.state_dir), "SANDBOX_UID_BASE": str(local.uid_base),
           "SANDBOX_UID_COUNT": str(local.uid_count)}
    out = tmp_path / "out.jsonl"
    argv = [sys.executable, "-m", "coding_agent_env.cli", "run", str(tasks), "--agent", "oracle", "--no-progress",
            "--out", str(out), "--results-db", store_location]
    done = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 3, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "exit status 3: 1 of 3 rollouts not in the results store"
    assert any(line.startswith(f"rollouts written to {out}; 2 of 3 to the results store") for line in lines)
    assert any(line.startswith("  'refused' #1 (rollout ") and "refuse" in line for line in lines), done.stdout
    assert "Traceback" not in done.stderr
    assert sorted(record.task_id for record in read_records(out)) == sorted(["plain", NUL_ID, "refused"])
    with ResultsStore(store_location) as store:
        assert sorted(row.task_id for row in store.rollouts()) == sorted(["plain", NUL_ID])


def test_runs_and_tasks_commands_print_text_no_terminal_takes_escaped(store_location: str, tmp_path: Path) -> None:
    """`runs list`, `runs show` and `tasks stats` (real processes: a UTF-8 stdout refuses a lone surrogate) print
    such text as its `\\uXXXX` escape, never raw, and never fail. On main `runs list` and `tasks stats` raised
    UnicodeEncodeError (and `runs show` of such a result a serialisation error)."""
    import subprocess
    import sys

    with ResultsStore(store_location) as store:
        run = store.new_run("batch", "odd")
        store.add(run, _odd("r-sur", SURROGATE_ID))
        store.add(run, _odd("r-nul", NUL_ID))

    def cli(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "coding_agent_env.cli", *args, "--results-db", store_location],
                              capture_output=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout.decode("utf-8")  # strict: what was printed is valid UTF-8

    listed = cli("runs", "list")
    assert "lone\\ud800surrogate#1" in listed and "nul\\u0000id#1" in listed and "\x00" not in listed
    assert "lone\\ud800surrogate" in cli("tasks", "stats")
    shown = json.loads(cli("runs", "show", "r-sur"))
    assert shown["task_id"] == SURROGATE_ID


def test_a_store_made_before_the_exact_column_gains_it_and_reads_as_before(tmp_path: Path) -> None:
    """A SQLite store of the old schema (no `exact`): opened, it gets the column; its rows read unchanged and new
    rows with NUL round-trip. (PostgreSQL: `ADD COLUMN IF NOT EXISTS` in the schema script.)"""
    import sqlite3

    path = tmp_path / "old.sqlite"
    with ResultsStore(path) as store:
        run = store.new_run("batch")
        store.add(run, record(1, 1.0))
    with sqlite3.connect(path) as conn:
        conn.execute("ALTER TABLE rollouts DROP COLUMN exact")
    conn.close()
    with ResultsStore(path) as store:
        store.add(run, _odd("r-nul", NUL_ID))
        assert {row.rollout_id: row.task_id for row in store.rollouts()} == {"r1": "task-1", "r-nul": NUL_ID}
