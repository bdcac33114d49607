"""What a loader yields: a task ready to run, or an error naming the bad entry."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from coding_agent_env.models import RolloutRequest
from coding_agent_env.sandbox.base import SandboxLimits
from coding_agent_env.tasks.context import image_tag

__all__ = ["DockerEnvironment", "LoadedTask", "TaskError", "TaskOptions"]


@dataclass(frozen=True)
class TaskOptions:
    """How tasks are turned into requests."""

    sandbox: str = "local"
    """The backend the tasks will run on: Harbor environments are laid out differently for `docker`."""
    caps: SandboxLimits | None = None
    """The server's sandbox limits: a task asking for more is clamped to them, and the notes say so."""
    ignore_dockerfile: bool = False
    """Run a Harbor task on a non-Docker backend even when its Dockerfile does more than FROM / WORKDIR / COPY /
    ENV (the steps are then skipped, and the notes say so)."""
    image_map: Mapping[str, str] = field(default_factory=dict)
    """Image references rewritten (`tasks.images.map_image`): each base image a task's Dockerfile builds `FROM`,
    and a prebuilt `[environment] docker_image`. From `IMAGE_MAP` and `run --image-map`."""


@dataclass(frozen=True)
class DockerEnvironment:
    """A Harbor task's `environment/` directory, to be built into the image its Docker sandbox runs."""

    context: Path
    content_hash: str
    """SHA-256 over the directory's paths and bytes: the image's cache key."""

    @property
    def tag(self) -> str:
        return image_tag(self.content_hash)


@dataclass(frozen=True)
class LoadedTask:
    """One task, ready to run."""

    request: RolloutRequest
    """The task (a `RolloutRequest` is a `models.Task` with the agent and endpoint fields), as the source gave it:
    a Harbor task has only task fields, a request file may name an agent; a batch run sets the agent's."""
    source: str
    """Where it came from: a file, `file:LINE` for a JSONL line, or a Harbor task directory."""
    notes: tuple[str, ...] = ()
    """What of the task could not be honoured on this backend (e.g. `allow_internet`, a workdir)."""
    environment: DockerEnvironment | None = None
    split: str | None = None
    """The split a JSONL line or request file names (its `split` field), for a server's task set
    (`tasks.catalog`); a batch run ignores it."""

    @property
    def task_id(self) -> str:
        return self.request.task_id or self.source

    def with_request(self, **update: object) -> LoadedTask:
        return dataclasses.replace(self, request=self.request.model_copy(update=update))


@dataclass(frozen=True)
class TaskError:
    """An entry that is not a task (or that the chosen backend cannot run): its source and why, in one line."""

    source: str
    message: str
    unsupported: bool = False
    """True when the task is fine but the chosen backend cannot run it (not the task's fault, not the agent's)."""

    def line(self) -> str:
        return f"{self.source}: {self.message}"
