"""A server's task set: tasks loaded once from Harbor directories, JSONL and request files, in named splits.

What `coding-agent-env serve --tasks SOURCE...` (the `TASKS` setting) serves through OpenEnv 0.10's Task API
(`api.protocols.task_api`), and what `reset(split=, index=)` / `run_rollout(split=, index=)` run.

A source is `PATH` or `SPLIT=PATH`. Without a split name a task's split is
- the `split` field of its JSONL line or request file (`tasks.requests`), else
- the directory level: a directory none of whose children is a task but some of whose children hold tasks is a
  directory of splits, each child named after its split (`tasks/train/<task>/task.toml`), else
- `train`.
Indices are positions in a split, in load order (a directory's tasks in name order, a JSONL file's lines in
order); tasks that fail to load are left out (each logged once at startup), so an index always names a task
that loaded. A task's id is its `task_id` (a Harbor task's name), else `<split>-<index>`.

Only the public part of a task leaves the server through the Task API (`CatalogTask.public`): its id, index,
split, instruction and step names; never its files, setup, tests, solution or environment.

Groups: `pick(split, seed=S)` without an index is task `S mod n` of the split, so every member of a group that
passes the same seed (TRL's async GRPO passes `seed=group_id`) gets the same task.

Neither index nor seed: the split's sampler chooses (`tasks.sampler`: uniform, sequential or curriculum, the
server's `TASK_SAMPLER`), fed by `observe` with every finished rollout or episode of a task of the set.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coding_agent_env.errors import CodingAgentEnvError, RequestError
from coding_agent_env.tasks.base import LoadedTask, TaskError, TaskOptions
from coding_agent_env.tasks.harbor import is_harbor_task
from coding_agent_env.tasks.sampler import Sampler, make_sampler
from coding_agent_env.tasks.source import iter_tasks

__all__ = [
    "DEFAULT_SPLIT",
    "CatalogSourceError",
    "CatalogTask",
    "NoTaskSetError",
    "TaskCatalog",
    "TaskIndexError",
    "UnknownSplitError",
    "UnknownTaskIdError",
    "split_type",
]

log = logging.getLogger(__name__)

DEFAULT_SPLIT = "train"
SPLIT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
OPENENV_SPLIT_TYPES = frozenset({"train", "validation", "test"})


class CatalogSourceError(CodingAgentEnvError):
    """A `--tasks` source that cannot be served (missing, a bad split name, nothing loaded): startup stops."""


class NoTaskSetError(RequestError):
    """A task set was asked for and this server has none."""

    def __init__(self) -> None:
        super().__init__("this server has no task set: start it with `coding-agent-env serve --tasks PATH`")


class UnknownSplitError(RequestError):
    def __init__(self, split: str, known: Sequence[str]) -> None:
        super().__init__(f"unknown split {split[:80]!r}; this server's splits are {list(known)}")


class TaskIndexError(RequestError, IndexError):
    """An index outside its split (an `IndexError` too: OpenEnv's Task API answers 400 "Invalid task index")."""

    def __init__(self, split: str, index: int, size: int) -> None:
        super().__init__(f"task index {index} out of range for split {split!r} ({size} tasks)")


class UnknownTaskIdError(RequestError):
    def __init__(self, task_id: str) -> None:
        super().__init__(f"no task with id {task_id[:120]!r} in this server's task set")


def split_type(name: str) -> str:
    """OpenEnv's split type for a split name: the name when it is one of train / validation / test, else
    `validation` (what openenv 0.10's server makes of a split given by name)."""
    return name if name in OPENENV_SPLIT_TYPES else "validation"


@dataclass(frozen=True)
class CatalogTask:
    """One task of the set, where it sits."""

    split: str
    index: int
    loaded: LoadedTask

    @property
    def id(self) -> str:
        return self.loaded.request.task_id or f"{self.split}-{self.index}"

    def public(self) -> dict[str, Any]:
        """What the Task API shows of the task: nothing a solver could use beyond its instruction."""
        view: dict[str, Any] = {"id": self.id, "index": self.index, "split": self.split,
                                "instruction": self.loaded.request.instruction}
        if self.loaded.request.steps:
            view["steps"] = [step.name for step in self.loaded.request.steps]
        return view


class TaskCatalog:
    """Splits of loaded tasks, read-only once built (shared by every session; no locking needed)."""

    def __init__(self, splits: Mapping[str, Sequence[LoadedTask]] | None = None, *, sampler: str = "uniform",
                 group_size: int = 8) -> None:
        """`sampler`: what chooses a task when a reset names a split alone (`tasks.sampler.SAMPLERS`; the
        curriculum's `group_size` is the trainer's G)."""
        self._splits: dict[str, tuple[CatalogTask, ...]] = {
            name: tuple(CatalogTask(name, index, loaded) for index, loaded in enumerate(tasks))
            for name, tasks in (splits or {}).items()
        }
        options = {"group_size": group_size} if sampler == "curriculum" else {}
        self.samplers: dict[str, Sampler] = {name: make_sampler(sampler, **options) for name in self._splits}
        self._by_id: dict[str, CatalogTask] = {}
        for tasks in self._splits.values():
            for task in tasks:
                self._by_id.setdefault(task.id, task)  # the first of equal ids wins; the index still names each

    @classmethod
    def load(cls, sources: Iterable[str], options: TaskOptions | None = None, *, sampler: str = "uniform",
             group_size: int = 8) -> TaskCatalog:
        """Load every source (see the module); `CatalogSourceError` for a source that is missing, names a bad
        split or yields no task at all. Tasks that fail to load are logged and left out."""
        splits: dict[str, list[LoadedTask]] = {}
        for spec in sources:
            named, path = _parse_source(spec)
            if not path.exists():
                raise CatalogSourceError(f"--tasks {spec}: no such file or directory")
            before = sum(len(tasks) for tasks in splits.values())
            for split, item in _items(path, named, options or TaskOptions()):
                if isinstance(item, TaskError):
                    log.warning("task set: left out %s", item.line())
                    continue
                splits.setdefault(named or item.split or split, []).append(item)
            if sum(len(tasks) for tasks in splits.values()) == before:
                raise CatalogSourceError(f"--tasks {spec}: no task loaded from it (see the warnings above)")
        for name in splits:
            if not SPLIT_NAME.match(name):
                raise CatalogSourceError(f"split name {name[:80]!r}: use letters, digits, '.', '_' or '-' (64 at most)")
        catalog = cls(splits, sampler=sampler, group_size=group_size)
        log.info("task set: %s", ", ".join(f"{name} ({len(tasks)})" for name, tasks in catalog._splits.items()))
        return catalog

    def __bool__(self) -> bool:
        return bool(self._splits)

    def split_names(self) -> list[str]:
        return list(self._splits)

    def splits(self) -> list[dict[str, Any]]:
        """Each split as the Task API lists it: name, OpenEnv type and size."""
        return [{"name": name, "type": split_type(name), "num_tasks": len(tasks)} for name, tasks in self._splits.items()]

    def tasks(self, split: str) -> tuple[CatalogTask, ...]:
        if not self._splits:
            raise NoTaskSetError()
        if split not in self._splits:
            raise UnknownSplitError(split, list(self._splits))
        return self._splits[split]

    def get(self, split: str, index: int) -> CatalogTask:
        tasks = self.tasks(split)
        if not 0 <= index < len(tasks):
            raise TaskIndexError(split, index, len(tasks))
        return tasks[index]

    def by_id(self, task_id: str) -> CatalogTask:
        if not self._splits:
            raise NoTaskSetError()
        task = self._by_id.get(task_id)
        if task is None:
            raise UnknownTaskIdError(task_id)
        return task

    def default_split(self) -> str:
        """`train` when there is one, else the only split; otherwise the caller must name one."""
        if DEFAULT_SPLIT in self._splits or not self._splits:
            return DEFAULT_SPLIT
        if len(self._splits) == 1:
            return next(iter(self._splits))
        raise UnknownSplitError(DEFAULT_SPLIT, list(self._splits))

    def pick(self, split: str | None = None, index: int | None = None, seed: int | None = None) -> CatalogTask:
        """The task a reset names: `index` in `split` (default `default_split()`), else the seed's (`seed mod n`:
        the same for every member of a group), else the split's sampler's choice."""
        name = self.default_split() if split is None else split
        if index is not None:
            return self.get(name, index)
        tasks = self.tasks(name)
        if seed is not None:
            return tasks[seed % len(tasks)]
        return tasks[self.samplers[name].choose([task.id for task in tasks])]

    def observe(self, task_id: str, reward: float | None, seconds: float = 0.0) -> None:
        """A finished rollout or episode: its task's sampler learns from it (a task not of the set: nothing)."""
        task = self._by_id.get(task_id)
        if task is not None:
            self.samplers[task.split].observe(task_id, reward, seconds)


def _parse_source(spec: str) -> tuple[str | None, Path]:
    name, sep, rest = spec.partition("=")
    if sep and SPLIT_NAME.match(name) and not Path(spec).exists():
        return name, Path(rest)
    return None, Path(spec)


def _items(path: Path, named: str | None, options: TaskOptions) -> Iterable[tuple[str, LoadedTask | TaskError]]:
    """(split, item) for every entry of one source."""
    if named is None and _is_split_dir(path):
        for child in sorted(path.iterdir()):
            if child.is_dir() and not child.is_symlink():
                for item in iter_tasks([child], options):
                    yield child.name, item
        return
    for item in iter_tasks([path], options):
        yield named or DEFAULT_SPLIT, item


def _is_split_dir(path: Path) -> bool:
    """A directory whose children are not tasks but hold tasks (each child a split)."""
    if not path.is_dir() or is_harbor_task(path):
        return False
    children = [child for child in path.iterdir() if child.is_dir() and not child.is_symlink()]
    if any(is_harbor_task(child) for child in children):
        return False
    return any(is_harbor_task(grandchild) for child in children for grandchild in child.iterdir() if grandchild.is_dir())
