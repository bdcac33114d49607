"""Naming a task of the server's task set (`tasks.catalog`) instead of sending it: `reset(split=, index=)`,
`reset(split=, seed=)` (a group), `reset(task_id=)`, and the same keys on `run_rollout`.

`TaskRef.of(arguments)` reads the keys (None when the arguments name no task of the set: they are a task of their
own); `TaskRef.pick(catalog)` finds the task. An episode runs it as `reset` with its task fields would
(`episode_task`: a multi-step task, or one whose image must be built first, is refused by name); a rollout runs
it with the call's agent fields (`rollout_request`). Task fields beside a reference are refused: a task of the set
runs as the set holds it, so every member of a group sees the same task.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from coding_agent_env.api.tools.base import ArgumentsError
from coding_agent_env.episode import parse_task
from coding_agent_env.episode.task import TASK_FIELDS
from coding_agent_env.models import RolloutRequest, Task, validation_summary
from coding_agent_env.tasks.catalog import CatalogTask, TaskCatalog

__all__ = ["GROUP_KEY", "REF_KEYS", "TaskRef", "episode_task", "rollout_request"]

REF_KEYS = frozenset({"split", "index"})
"""Keys that name a task of the set (with `seed` for a group, or `task_id` alone)."""
AGENT_FIELDS = frozenset(RolloutRequest.model_fields) - frozenset(Task.model_fields)
GROUP_KEY = "group_id"
"""The one task field a reference may carry: the group its run belongs to (`Task.group_id`)."""


@dataclass(frozen=True)
class TaskRef:
    split: str | None = None
    index: int | None = None
    seed: int | None = None
    task_id: str | None = None

    @classmethod
    def of(cls, arguments: Mapping[str, Any], catalog: TaskCatalog | None = None, *,
           extra: frozenset[str] = frozenset()) -> TaskRef | None:
        """The reference in `arguments`, or None. `split` / `index` always make one; `task_id` alone (besides
        `extra`, keys the caller handles: OpenEnv's `seed` / `episode_id`, a rollout's agent fields) makes one
        when `catalog` holds a task set. Wrong types and task fields beside a reference are `ArgumentsError`."""
        keys = set(arguments) - extra - {"seed"}
        named = keys & REF_KEYS
        if not named and not (catalog and keys == {"task_id"}):
            return None
        mixed = sorted(keys - REF_KEYS - {"task_id", GROUP_KEY})
        if mixed:
            raise ArgumentsError(f"a task of the server's set runs as the set holds it: give split/index (or "
                                 f"task_id) without task fields (got {', '.join(mixed[:10])})")
        split, index, seed, task_id = (arguments.get(key) for key in ("split", "index", "seed", "task_id"))
        if split is not None and not isinstance(split, str):
            raise ArgumentsError("split must be a string")
        for name, value in (("index", index), ("seed", seed)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ArgumentsError(f"{name} must be a non-negative integer")
        if task_id is not None and not isinstance(task_id, str):
            raise ArgumentsError("task_id must be a string")
        return cls(split, index, seed, task_id)

    def group_id(self, given: Any = None) -> Any:
        """The group a run of this reference belongs to: `given`, else, for a group's seed (`split` and `seed`,
        no index: every member of a GRPO group the same task), one named after the split and the seed, so the
        group's members share one setup (`Task.group_id`); else None."""
        if given is not None or self.seed is None or self.index is not None:
            return given
        split = hashlib.sha256((self.split or "").encode("utf-8", "surrogatepass")).hexdigest()[:12]
        return f"seed-{split}-{self.seed}"

    def pick(self, catalog: TaskCatalog) -> CatalogTask:
        """The task (`RequestError` subclasses name what is missing: no set, split, index, id)."""
        if self.task_id is not None and self.split is None and self.index is None:
            return catalog.by_id(self.task_id)
        if self.split is not None:
            catalog.tasks(self.split)  # an unknown split is said before a missing index
        return catalog.pick(self.split, self.index, self.seed)


def episode_task(task: CatalogTask, group_id: Any = None) -> RolloutRequest:
    """The task as an interactive episode runs it (`parse_task` of its task fields: the same checks as a reset
    that sends them), in group `group_id` if given; `ArgumentsError` for a task an episode cannot run."""
    request = task.loaded.request
    if request.steps:
        raise ArgumentsError(f"task {task.id!r} has {len(request.steps)} steps: run it as a rollout "
                             "(run_rollout with split/index), not an episode")
    _check_image(task)
    fields = request.model_dump(exclude_unset=True, include=set(TASK_FIELDS))
    group = {} if group_id is None else {GROUP_KEY: group_id}
    return parse_task({**fields, **group, "task_id": task.id})


def rollout_request(task: CatalogTask, agent_fields: Mapping[str, Any]) -> RolloutRequest:
    """The task with the call's agent fields (agent, endpoint, model, mode, ...) and its `group_id`, if given;
    `ArgumentsError` otherwise."""
    unknown = sorted(set(agent_fields) - AGENT_FIELDS - {GROUP_KEY})
    if unknown:
        raise ArgumentsError(f"not agent fields: {', '.join(unknown[:10])}")
    _check_image(task)
    base = task.loaded.request.model_dump(exclude_unset=True, exclude=set(AGENT_FIELDS))
    try:
        return RolloutRequest.model_validate({**base, **agent_fields, "task_id": task.id})
    except ValidationError as exc:
        raise ArgumentsError(validation_summary(exc)) from None


def _check_image(task: CatalogTask) -> None:
    if task.loaded.environment is not None and task.loaded.request.image is None:
        raise ArgumentsError(f"task {task.id!r} needs its Docker image built from its environment/ first: run it "
                             "with `coding-agent-env run` (which builds it), or give the server an image map")

