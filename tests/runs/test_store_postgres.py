"""The results store shared in PostgreSQL: writers in several processes lose nothing and prune safely, two
server replicas write one store that the Runs view reads, a bad URL or an unreachable server is a clear error
that never shows the password, and a `postgresql:` value never becomes a directory."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from coding_agent_env.errors import SettingsError
from coding_agent_env.models import RolloutResult, RolloutStatus
from coding_agent_env.runs.journal import Record
from coding_agent_env.runs.store import ResultsStore, default_path
from coding_agent_env.runs.store_errors import StoreLocationError, StoreUnavailableError
from coding_agent_env.runs.store_location import PostgresLocation, parse_location, redact
from coding_agent_env.settings import Settings
from tests.helpers import serving, wait_until
from tests.pg import PostgresServer

ROOT = Path(__file__).resolve().parents[2]

# A writer process: opens the store, waits for the go file (so the writers overlap), writes its rows, pruning
# after each one when it has a retention; prints its run id.
WRITER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from coding_agent_env.models import RolloutResult, RolloutStatus
    from coding_agent_env.runs.journal import Record
    from coding_agent_env.runs.store import ResultsStore

    url, name, count, keep, ready, go = sys.argv[1:]
    with ResultsStore(url, max_rollouts=int(keep)) as store:
        run = store.new_run("server", name)
        Path(ready).touch()
        deadline = time.monotonic() + 60
        while not Path(go).exists():
            if time.monotonic() > deadline:
                sys.exit("no go")
            time.sleep(0.005)
        for n in range(int(count)):
            result = RolloutResult(rollout_id=f"{name}-{n}", task_id=f"task-{n % 5}", agent="oracle",
                                   sandbox="local", status=RolloutStatus.COMPLETED, reward=1.0)
            store.add(run, Record(result.task_id, 1, result))
            if int(keep):
                store.prune()
    print(run)
""")


def _writers(url: str, tmp_path: Path, count: int, rows: int, keep: int = 0) -> list[str]:
    """Run `count` writer processes at once against `url`; their run ids (each must succeed)."""
    go = tmp_path / "go"
    procs = []
    try:
        for i in range(count):
            argv = [sys.executable, "-c", WRITER, url, f"w{i}", str(rows), str(keep), str(tmp_path / f"ready{i}"),
                    str(go)]
            procs.append(subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        wait_until(lambda: all((tmp_path / f"ready{i}").exists() or procs[i].poll() is not None for i in range(count)),
                   "the writers to open the store", timeout_s=60)
        go.touch()
        outputs = [proc.communicate(timeout=120) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
    return [out.strip() for out, _ in outputs]


def test_writer_processes_writing_at_once_lose_nothing(postgres_url: str, tmp_path: Path) -> None:
    runs = _writers(postgres_url, tmp_path, count=4, rows=150)
    with ResultsStore(postgres_url) as store:
        assert len(store.rollouts(limit=10_000)) == 600
        assert {r.run_id: r.rollouts for r in store.runs()} == dict.fromkeys(runs, 150)
        assert sum(total for _, total, *_ in store.task_outcomes()) == 600


def test_writers_pruning_at_once_neither_deadlock_nor_fail(postgres_url: str, tmp_path: Path) -> None:
    """Each of three writers prunes to 40 rollouts after every write: all finish, the newest 40 stay."""
    _writers(postgres_url, tmp_path, count=3, rows=120, keep=40)
    with ResultsStore(postgres_url, max_rollouts=40) as store:
        store.prune()
        kept = store.rollouts(limit=1000)
        assert len(kept) == 40
        assert {row.rollout_id for row in kept} >= {f"w{i}-119" for i in range(3)}  # each writer's last row


def test_a_postgres_url_is_a_store_never_a_directory(postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from coding_agent_env.cli.main import main

    monkeypatch.chdir(tmp_path)
    settings = Settings.from_env({"RESULTS_DB": postgres_url, "STATE_DIR": str(tmp_path / "state")})
    assert isinstance(default_path(settings), PostgresLocation)
    with ResultsStore.from_settings(settings) as store:
        run = store.new_run("batch", "shared")
        store.add(run, Record("t", 1, RolloutResult(rollout_id="r1", task_id="t", agent="oracle", sandbox="local",
                                                    status=RolloutStatus.COMPLETED, reward=1.0)))
    assert main(["runs", "list", "--runs", "--results-db", postgres_url]) == 0
    assert "shared" in capsys.readouterr().out
    monkeypatch.setenv("RESULTS_DB", postgres_url)
    assert main(["tasks", "stats"]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[:2] == ["t", "1"]
    assert list(tmp_path.iterdir()) == []  # no `postgresql:` directory, no state dir: nothing on disk
    password = postgres_url.split(":")[2].split("@")[0]
    assert password not in str(store.path) and password not in repr(store.path) and "***" in str(store.path)


@pytest.mark.parametrize("value", ["postgresql://cae:hunter2-secret@db:port/x", "postgres://cae:hunter2-secret@/x?=1",
                                   "postgresql:/cae:hunter2-secret@db/x", "mysql://cae:hunter2-secret@db/x"])
def test_a_bad_url_is_refused_clearly_and_redacted(value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from coding_agent_env.cli.main import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SettingsError, match="RESULTS_DB") as caught:
        Settings.from_env({"RESULTS_DB": value})
    assert "hunter2" not in str(caught.value)
    with pytest.raises(StoreLocationError) as refused:
        ResultsStore(value)
    assert "hunter2" not in str(refused.value)
    with pytest.raises(SystemExit):
        main(["runs", "list", "--results-db", value])
    assert "hunter2" not in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_an_unreachable_or_refusing_server_is_a_clear_redacted_error(postgres_server: PostgresServer,
                                                                     tmp_path: Path) -> None:
    wrong = postgres_server.url().replace(postgres_server.password, "wrong-pass-xyz")
    with pytest.raises(StoreUnavailableError, match="cannot connect.*password authentication failed") as refused:
        ResultsStore(wrong)
    assert "wrong-pass-xyz" not in str(refused.value) and refused.value.__cause__ is None
    nowhere = f"postgresql://cae:pw-{postgres_server.password}@/x?host={tmp_path}&connect_timeout=2"
    with pytest.raises(StoreUnavailableError, match="cannot connect") as down:
        ResultsStore(nowhere)
    assert postgres_server.password not in str(down.value)
    with pytest.raises(StoreLocationError, match='invalid URI query parameter: "bogus"') as unknown:
        ResultsStore(postgres_server.url() + "&bogus=1")  # well-formed, but not libpq's: refused when opened
    assert postgres_server.password not in str(unknown.value)
    missing_db = postgres_server.url("no_such_database")
    with pytest.raises(StoreUnavailableError, match="does not exist") as absent:
        ResultsStore(missing_db)
    assert postgres_server.password not in str(absent.value)


def test_the_runs_view_notes_an_unreachable_store(tmp_path: Path) -> None:
    from coding_agent_env.api.ui.runs_tab import list_rows

    settings = Settings.from_env({"RESULTS_DB": f"postgresql://cae:s3cret-pw@/x?host={tmp_path}&connect_timeout=2"})
    rollouts, runs, note = list_rows(settings, "", "", "", "", "", "")
    assert (rollouts, runs) == ([], []) and "cannot be read" in note and "s3cret-pw" not in note


def test_without_the_driver_the_error_names_the_extra(tmp_path: Path) -> None:
    """In a process where `psycopg` cannot be imported (as without the `postgres` extra)."""
    script = textwrap.dedent("""
        import sys
        sys.modules["psycopg"] = None  # what an absent package looks like to `import`
        from coding_agent_env.runs.store import ResultsStore
        from coding_agent_env.runs.store_errors import StoreMissingExtraError
        try:
            ResultsStore("postgresql://cae:pw@/x?host=/nonexistent")
        except StoreMissingExtraError as exc:
            print(exc)
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          check=True)
    assert "pip install 'coding-agent-env[postgres]'" in done.stdout


def test_locations_parse_and_redact() -> None:
    assert parse_location("results/r.sqlite") == Path("results/r.sqlite")
    socket = parse_location("postgresql:///results?host=/run/postgresql&user=cae&password=p%40ss")
    assert isinstance(socket, PostgresLocation) and "p%40ss" not in str(socket) and "password=***" in str(socket)
    assert set(socket.secrets()) == {"p%40ss", "p@ss"}
    assert redact("postgres://u:pw@h1:5432,h2:5433/db?sslmode=require") == "postgres://u:***@h1:5432,h2:5433/db?" \
                                                                          "sslmode=require"
    assert redact("postgresql://u@h/db") == "postgresql://u@h/db"


def _uid_range() -> dict[str, str]:
    """A sandbox uid range of this server's own (replicas, and suites, may run side by side)."""
    return {"SANDBOX_UID_BASE": str(300_000 + secrets.randbelow(20_000) * 64), "SANDBOX_UID_COUNT": "64"}


def test_two_server_replicas_write_one_store_the_runs_view_reads(postgres_url: str, tmp_path: Path) -> None:
    from coding_agent_env.api.ui.runs_tab import chart_tables, list_rows
    from coding_agent_env.client import CodingAgentEnv
    from tests.ui.conftest import UiServer

    servers, states = [], []
    try:
        for name in ("a", "b"):
            state = Path(tempfile.mkdtemp(prefix="cae-replica-"))
            os.chmod(state, 0o711)  # not under tmp_path (0700): sandbox uids traverse to their roots
            states.append(state)
            servers.append(UiServer(state, tmp_path / f"{name}.log", RESULTS_FROM_SERVER="true",
                                    RESULTS_DB=postgres_url, ENABLE_WEB_INTERFACE="false", **_uid_range()))
        for server in servers:
            wait_until(serving(server.url + "/health", server.proc, server.log_path.read_text),
                       "the replica to come up", timeout_s=60, interval_s=0.05)
        results = []
        for name, server in zip("ab", servers, strict=True):
            with CodingAgentEnv(server.url).sync() as env:
                env.reset()
                results.append(env.run_rollout(instruction="x", agent="oracle", solution=["echo hi > a"],
                                               verify=["test -f a"], task_id=f"replica-{name}"))
        settings = Settings.from_env({"RESULTS_DB": postgres_url})
        wanted = {result.rollout_id for result in results}

        def both_listed() -> list[list[object]] | None:
            rollouts, runs, _ = list_rows(settings, "", "", "", "", "", "")
            return runs if {row[0] for row in rollouts} == wanted else None

        runs = wait_until(both_listed, "both replicas' rollouts in the Runs view", timeout_s=30, interval_s=0.05)
        assert [row[2] for row in runs] == ["server", "server"]  # one run per replica process
        rollouts, _, _ = list_rows(settings, "replica-b", "", "", "1", "", "")
        assert [row[2] for row in rollouts] == ["replica-b"] and rollouts[0][7] == 1.0
        assert set(chart_tables(settings, "", "", "", "", "", "")["tasks"]["task"]) == {"replica-a", "replica-b"}
    finally:
        for server in servers:
            server.stop()
        for state in states:
            shutil.rmtree(state, ignore_errors=True)
    password = postgres_url.split(":")[2].split("@")[0]
    for server in servers:
        assert password not in server.log_path.read_text(errors="replace")


def test_a_batch_run_adds_to_the_shared_store_and_prints_it_redacted(postgres_url: str, tmp_path: Path) -> None:
    """`coding-agent-env run --results-db postgresql://...`: the rows land in the database, and what the batch
    prints names the store without its password."""
    state = Path(tempfile.mkdtemp(prefix="cae-batch-"))
    os.chmod(state, 0o711)  # sandbox uids traverse to their roots
    try:
        argv = [sys.executable, "-m", "coding_agent_env.cli", "run", str(ROOT / "examples" / "tasks" / "hello-file"),
                "--agent", "oracle", "--out", str(tmp_path / "out.jsonl"), "--no-progress", "--results-db",
                postgres_url]
        done = subprocess.run(argv, cwd=tmp_path, env={**os.environ, "STATE_DIR": str(state), **_uid_range()},
                              capture_output=True, text=True, timeout=300, check=False)
    finally:
        shutil.rmtree(state, ignore_errors=True)
    assert done.returncode == 0, done.stdout + done.stderr
    password = postgres_url.split(":")[2].split("@")[0]
    assert password not in done.stdout + done.stderr and "and the results store postgresql://cae:***@/" in done.stdout
    with ResultsStore(postgres_url) as store:
        (row,) = store.rollouts()
        assert row.task_id == "hello-file" and row.reward == 1.0 and store.runs()[0].origin == "batch"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]


def test_a_dropped_connection_is_replaced_without_losing_the_write(postgres_server: PostgresServer,
                                                                   postgres_url: str) -> None:
    """The server ends the store's session (as a restart or failover would): the next write still lands."""
    with ResultsStore(postgres_url) as store:
        run = store.new_run("server")
        database = postgres_url.split("@/", 1)[1].split("?", 1)[0]
        postgres_server.admin("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = "
                              f"'coding-agent-env results store' AND datname = '{database}'")
        store.add(run, Record("t", 1, RolloutResult(rollout_id="after", task_id="t", agent="oracle", sandbox="local",
                                                    status=RolloutStatus.COMPLETED, reward=1.0)))
        assert [row.rollout_id for row in store.rollouts()] == ["after"]


def test_a_result_holding_a_nul_character_does_not_break_the_charts(postgres_url: str) -> None:
    """A sandbox's output may hold NUL; jsonb cannot: that row's chart fields are empty, every other row's kept."""
    from coding_agent_env.models import CommandResult, Timings

    plain = RolloutResult(rollout_id="plain", task_id="t", agent="oracle", sandbox="local",
                          status=RolloutStatus.COMPLETED, reward=1.0, timings=Timings(total_s=2.5))
    nul = plain.model_copy(update={"rollout_id": "nul", "setup_results": [
        CommandResult(cmd="printf 'x\\0y'", exit_code=0, stdout="x\x00y", stderr="", duration_s=0.1)]})
    with ResultsStore(postgres_url) as store:
        run = store.new_run("batch", "nul")
        for result in (plain, nul):
            store.add(run, Record("t", 1, result))
        measured = {row.rollout_id: fields for row, fields in store.measures()}
        assert measured["plain"]["timings"]["total_s"] == 2.5
        assert measured["nul"] == {"timings": {}, "limits_hit": []}
        assert store.result("nul").setup_results[0].stdout == "x\x00y"  # type: ignore[union-attr]


async def test_the_servers_store_keeps_a_nul_result_and_reports_a_refused_one(postgres_url: str, tmp_path: Path,
                                                                              caplog: pytest.LogCaptureFixture) -> None:
    """The server's recorder (what `RESULTS_FROM_SERVER` writes through): a result whose task id holds NUL is
    stored exact; one the database refuses (a constraint) is named in one log line and kept in
    STATE_DIR/results-unstored.jsonl. On main the NUL row was lost with a traceback, and so was the refused one."""
    import psycopg

    from coding_agent_env.runs.journal import read_records
    from coding_agent_env.runs.recorder import UNSTORED_FILE, ServerRecorder

    with ResultsStore(postgres_url):
        pass
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE rollouts ADD CONSTRAINT refuse CHECK (task_id <> 'refused')")
    settings = Settings.from_env({"RESULTS_DB": postgres_url, "STATE_DIR": str(tmp_path / "state")})
    recorder = ServerRecorder(settings)
    for rollout_id, task_id in (("r-nul", "nul\x00id"), ("r-refused", "refused")):
        recorder(RolloutResult(rollout_id=rollout_id, task_id=task_id, agent="oracle", sandbox="local",
                               status=RolloutStatus.COMPLETED, reward=1.0))
    await recorder.aclose()
    with ResultsStore(postgres_url) as store:
        assert [(row.rollout_id, row.task_id) for row in store.rollouts()] == [("r-nul", "nul\x00id")]
    (kept,) = read_records(tmp_path / "state" / UNSTORED_FILE)
    assert kept.result.rollout_id == "r-refused" and kept.task_id == "refused"
    (line,) = [r.getMessage() for r in caplog.records if "r-refused" in r.getMessage()]
    assert "not stored" in line and "refuse" in line and UNSTORED_FILE in line
    assert not any(r.exc_info for r in caplog.records)


def test_a_postgres_store_made_before_the_exact_column_gains_it(postgres_url: str) -> None:
    import psycopg

    with ResultsStore(postgres_url) as store:
        run = store.new_run("batch")
        store.add(run, Record("t", 1, RolloutResult(rollout_id="old", task_id="t", agent="oracle", sandbox="local",
                                                    status=RolloutStatus.COMPLETED, reward=1.0)))
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE rollouts DROP COLUMN exact")
    with ResultsStore(postgres_url) as store:
        store.add(run, Record("nul\x00", 1, RolloutResult(rollout_id="new", task_id="nul\x00", agent="oracle",
                                                          sandbox="local", status=RolloutStatus.COMPLETED)))
        assert {row.rollout_id: row.task_id for row in store.rollouts()} == {"old": "t", "new": "nul\x00"}
