"""Dispatch task sources by shape: a JSONL file, a JSON/YAML request file, or Harbor task directories."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from coding_agent_env.tasks.base import LoadedTask, TaskError, TaskOptions
from coding_agent_env.tasks.harbor import iter_harbor_dir
from coding_agent_env.tasks.requests import load_request_file, read_jsonl

__all__ = ["count_tasks", "iter_tasks"]


def iter_tasks(sources: Iterable[str | Path], options: TaskOptions | None = None) -> Iterator[LoadedTask | TaskError]:
    """Every task of every source, in order, lazily: a `.jsonl` file line by line, a directory as Harbor tasks
    (one, or a directory of them), any other file as one JSON or YAML request."""
    options = options or TaskOptions()
    for source in sources:
        path = Path(source)
        if path.is_dir():
            found = False
            for item in iter_harbor_dir(path, options):
                found = True
                yield item
            if not found:
                yield TaskError(str(path), "no Harbor tasks here (no task.toml in it or its subdirectories)")
        elif path.suffix == ".jsonl":
            yield from read_jsonl(path)
        elif path.exists():
            yield load_request_file(path)
        else:
            yield TaskError(str(path), "no such file or directory")


def count_tasks(sources: Iterable[str | Path]) -> int:
    """How many entries `iter_tasks` will yield at most, counted cheaply (lines, task directories), for an ETA."""
    total = 0
    for source in sources:
        path = Path(source)
        if path.is_dir():
            total += 1 if (path / "task.toml").is_file() else sum(1 for child in path.iterdir() if child.is_dir())
        elif path.suffix == ".jsonl" and path.is_file():
            with path.open("rb") as handle:
                total += sum(1 for line in handle if line.strip())
        else:
            total += 1
    return total
