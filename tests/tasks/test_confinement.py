"""Harbor task directories are read only inside themselves (INTEGRITY rule 32): a file or directory whose real
path leaves the task directory, the roots included, refuses the task with a load error naming it, and nothing of
it is read, laid, packed or written; a FIFO in a task directory never hangs the loader."""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from coding_agent_env.cli.main import main
from coding_agent_env.settings import Settings
from coding_agent_env.tasks import LoadedTask, TaskError, TaskOptions, iter_tasks
from coding_agent_env.tasks.confined import TaskDir, TaskFileError
from coding_agent_env.tasks.context import content_hash, pack
from tests.tasks.harbor_fixtures import make_task

SECRET = "SECRET-7f3a9c-operator-only"
LOAD_DEADLINE_S = 30


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory beside the tasks, full of the secret: a file, a task.toml, a Dockerfile and a test.sh."""
    root = tmp_path / "outside"
    root.mkdir()
    (root / "secret.txt").write_text(f"{SECRET}\n")
    (root / "task.toml").write_text(f'name = "{SECRET}"\n')
    (root / "Dockerfile").write_text(f"FROM scratch\nWORKDIR /workspace\nCOPY secret.txt .\n# {SECRET}\n")
    (root / "test.sh").write_text(f"#!/bin/bash\necho {SECRET}\n")
    (root / "solve.sh").write_text(f"#!/bin/bash\necho {SECRET}\n")
    return root


def relink(path: Path, target: Path) -> None:
    """Replace the file or directory `path` with a link to `target`."""
    if path.is_dir() and not path.is_symlink():
        for child in sorted(path.rglob("*"), reverse=True):
            child.rmdir() if child.is_dir() else child.unlink()
        path.rmdir()
    elif path.exists() or path.is_symlink():
        path.unlink()
    path.symlink_to(target)


# Each case: the path (as the task spells it) made a link to the outside, and what in `outside` it points at.
CASES: dict[str, tuple[str, str]] = {
    "instruction.md": ("instruction.md", "secret.txt"),
    "task.toml": ("task.toml", "task.toml"),
    "solve.sh": ("solution/solve.sh", "solve.sh"),
    "environment/": ("environment", "."),
    "tests/": ("tests", "."),
    "solution/": ("solution", "."),
    "Dockerfile": ("environment/Dockerfile", "Dockerfile"),
    "entry in tests/": ("tests/helper.py", "secret.txt"),
    "entry in environment/": ("environment/data.txt", "secret.txt"),
    "directory in environment/": ("environment/src", "."),
    "dangling link": ("tests/gone.py", "no-such-file"),
}


def plant(root: Path, outside: Path, case: str) -> tuple[Path, str]:
    """A good task directory (its Dockerfile COPYing data.txt and src/ into the workdir) with `case` planted;
    returns it and the path the case made a link."""
    task = good_task(root, case.replace("/", "").replace(" ", "-").replace(".", "-"))
    path, target = CASES[case]
    relink(task / path, (outside / target).resolve())
    return task, path


def good_task(root: Path, name: str) -> Path:
    return make_task(root, name, dockerfile="FROM scratch\nWORKDIR /workspace\nCOPY data.txt .\nCOPY src/ ./src/\n",
                     env_files={"data.txt": "data\n", "src/m.py": "M = 1\n"}, extra_tests={"helper.py": "H = 1\n"})


@pytest.mark.parametrize("sandbox", ["local", "docker"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_path_leaving_the_task_directory_refuses_the_task(tmp_path: Path, outside: Path, case: str,
                                                             sandbox: str) -> None:
    task, named = plant(tmp_path / "tasks", outside, case)
    (item,) = iter_tasks([task], TaskOptions(sandbox=sandbox))
    assert isinstance(item, TaskError), item
    assert item.source == str(task) and f"{named} leaves the task directory" in item.message, item.message
    assert not item.unsupported  # the task's fault, not the backend's
    assert SECRET not in repr(item)


def test_the_same_task_without_the_link_loads(tmp_path: Path) -> None:
    """The cases' task is a good one: each refusal above is the link's doing."""
    task = good_task(tmp_path, "fine")
    for sandbox in ("local", "docker"):
        (item,) = iter_tasks([task], TaskOptions(sandbox=sandbox))
        assert isinstance(item, LoadedTask), item
        assert item.request.files == {"data.txt": "data\n", "src/m.py": "M = 1\n"}


def test_links_that_stay_inside_are_followed_for_roots(tmp_path: Path) -> None:
    """Only leaving is refused: a root linked to a place inside the task directory is read from there."""
    task = make_task(tmp_path, "inside")
    (task / "docs").mkdir()
    (task / "docs" / "task.md").write_text("From docs.")
    relink(task / "instruction.md", Path("docs") / "task.md")
    (task / "shared-tests").mkdir()
    (task / "tests" / "test.sh").rename(task / "shared-tests" / "test.sh")
    relink(task / "tests", Path("shared-tests"))
    (item,) = iter_tasks([task])
    assert isinstance(item, LoadedTask), item
    assert item.request.instruction == "From docs." and "test.sh" in item.request.verify_files


def test_a_linked_task_in_a_directory_of_tasks_is_refused(tmp_path: Path) -> None:
    """A directory of tasks is the boundary for its members: a member linked from elsewhere is named, not read."""
    elsewhere = make_task(tmp_path / "elsewhere", "foreign", instruction=SECRET)
    tasks = tmp_path / "tasks"
    make_task(tasks, "own")
    (tasks / "foreign").symlink_to(elsewhere)
    (tasks / "README.md").symlink_to(elsewhere / "instruction.md")  # not a task: ignored, as any file is
    items = {Path(item.source).name: item for item in iter_tasks([tasks])}
    assert set(items) == {"own", "foreign"} and isinstance(items["own"], LoadedTask)
    foreign = items["foreign"]
    assert isinstance(foreign, TaskError) and "leaving the directory of tasks" in foreign.message
    assert SECRET not in repr(items)
    (direct,) = iter_tasks([elsewhere])  # given by its own path, it is the user's choice
    assert isinstance(direct, LoadedTask) and direct.request.instruction == SECRET


def test_run_writes_nothing_of_a_secret_behind_a_link(tmp_path: Path, outside: Path, settings: Settings,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A batch over every case beside a good task: each case is a load error naming its path, the good task
    runs, and the secret is in no output (results, stdout, stderr)."""
    local = settings.backends[0]
    monkeypatch.setenv("STATE_DIR", str(settings.state_dir))
    monkeypatch.setenv("SANDBOX_UID_BASE", str(local.uid_base))  # type: ignore[union-attr]
    monkeypatch.setenv("SANDBOX_UID_COUNT", str(local.uid_count))  # type: ignore[union-attr]
    tasks = tmp_path / "tasks"
    named = {plant(tasks, outside, case)[1] for case in CASES}
    make_task(tasks, "zz-good")
    out = tmp_path / "out.jsonl"
    assert main(["run", str(tasks), "--agent", "oracle", "--out", str(out), "--no-progress"]) == 1
    written = out.read_text()
    assert '"zz-good"' in written and written.count("\n") == 1
    captured = capsys.readouterr()
    for path in named:
        assert f"{path} leaves the task directory" in captured.err
    assert SECRET not in written + captured.out + captured.err


def test_pack_and_hash_never_follow_links(tmp_path: Path, outside: Path) -> None:
    """What `run --server` sends (and the tag it names) holds nothing a link points at, even one planted after
    the task was loaded."""
    context = tmp_path / "environment"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM scratch\n")
    before = content_hash(context)
    (context / "leak.txt").symlink_to(outside / "secret.txt")
    (context / "leakdir").symlink_to(outside)
    assert SECRET.encode() not in gzip.decompress(pack(context))
    assert content_hash(context) == before


@pytest.fixture
def fifo_cleanup() -> Iterator[list[Path]]:
    """FIFOs a test made: a loader stuck opening one (the bug under test) is released by opening the write end."""
    made: list[Path] = []
    yield made
    for fifo in made:
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass  # no reader blocked on it: nothing to release


@pytest.mark.parametrize("where", ["instruction.md", "tests/extra.fifo", "environment/Dockerfile",
                                   "environment/data.txt", "solution/solve.sh"])
def test_a_fifo_in_a_task_directory_does_not_hang_the_loader(tmp_path: Path, where: str,
                                                              fifo_cleanup: list[Path]) -> None:
    task = make_task(tmp_path, "fifo", dockerfile="FROM scratch\nWORKDIR /workspace\nCOPY data.txt .\n",
                     env_files={"data.txt": "data\n"})
    fifo = task / where
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo)
    fifo_cleanup.append(fifo)
    # In a thread with a deadline: a loader blocked on the FIFO fails the test instead of hanging the suite
    # (the fixture then releases it, and the thread ends).
    pool = ThreadPoolExecutor(1)
    try:
        for sandbox in ("local", "docker"):
            (item,) = pool.submit(list, iter_tasks([task], TaskOptions(sandbox=sandbox))).result(LOAD_DEADLINE_S)
            if where in ("instruction.md", "environment/data.txt"):  # needed: refused, naming it
                assert isinstance(item, TaskError) and f"{where} is not a regular file" in item.message, item
            else:  # not needed, or optional: left out
                assert isinstance(item, LoadedTask), item
    finally:
        pool.shutdown(wait=False)


def test_reads_are_bounded(tmp_path: Path) -> None:
    """A file, or a tree of files, bigger than a request can carry is refused before more of it is read."""
    task = make_task(tmp_path, "big", extra_tests={"a.txt": "a" * 600, "b.txt": "b" * 600})
    root = TaskDir(task, max_file_bytes=1000)
    with pytest.raises(TaskFileError, match="tests/ holds more than 1000 bytes"):
        root.text_tree("tests")
    (task / "instruction.md").write_text("i" * 1001)
    with pytest.raises(TaskFileError, match="instruction.md is over 1000 bytes"):
        root.read_text("instruction.md")
