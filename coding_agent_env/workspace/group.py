"""A group's set-up template: the task's sandbox provisioned and set up once, frozen by its backend.

`group_key` says which members may share one: the group id and everything the sandbox and the setup depend on
(backend, image, variables, limits, layout, files, setup commands and their user and deadline), so a member
whose task differs in any of them never starts from another's state. `make_template` is what the first member's
join runs (`sandbox.templates.GroupTemplates`): a sandbox of the member's spec without its LLM access (setup
never reaches the relay; the template belongs to no rollout), the task's files, its setup commands; then the
backend's `snapshot`, or, when the setup failed, the sandbox closed and the failure kept for every member.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from coding_agent_env.aio import shielded
from coding_agent_env.models import CommandResult, Task
from coding_agent_env.sandbox.base import Sandbox, SandboxBackend, SandboxSpec, SandboxTemplate
from coding_agent_env.workspace.commands import CommandRunner
from coding_agent_env.workspace.setup import SetupFailure, run_setup

__all__ = ["GroupSetup", "group_key", "group_size", "make_template", "release_setup"]

_TASK_FIELDS = ("setup", "files", "outside_files", "workdir", "command_timeout_s", "verify_user", "agent_user",
                "env", "image", "verify_files_root")
"""What of a task its set-up state depends on (besides the spec's own fields)."""


@dataclass(frozen=True)
class GroupSetup:
    """A group's set-up state: its `template` (None when the setup failed: `failure`), the setup's `results`
    and how long provisioning and the setup took."""

    template: SandboxTemplate | None
    results: tuple[CommandResult, ...]
    failure: SetupFailure | None
    setup_s: float

    @property
    def size(self) -> int:
        """Bytes its template's writable layer holds (0 without one: a failed setup holds nothing)."""
        return self.template.size if self.template is not None else 0


def group_key(task: Task, spec: SandboxSpec, backend: str) -> tuple[str, str, str]:
    """(backend, group id, digest of what the set-up state depends on)."""
    assert task.group_id is not None
    fields = task.model_dump(mode="json", include=set(_TASK_FIELDS))
    shape = {
        "task": fields,
        "image": spec.image,
        "env": dict(sorted(spec.env.items())),
        "limits": dataclasses.asdict(spec.limits) if spec.limits is not None else None,
        "workdir": spec.workdir,
        "roots": list(spec.writable_roots),
        "tests": spec.tests,
        "users": spec.users,
        "host_network": spec.network == "host",
    }
    digest = hashlib.sha256(json.dumps(shape, sort_keys=True, default=str).encode()).hexdigest()
    return backend, task.group_id, digest


def template_spec(spec: SandboxSpec) -> SandboxSpec:
    """The template's sandbox: the member's spec without its LLM access (and a rollout id of its own)."""
    return dataclasses.replace(
        spec,
        rollout_id=f"group{secrets.token_hex(6)}",
        network="host" if spec.network == "host" else "none",
        relay=None,
        agents_dir=None,
    )


async def make_template(
    backend: SandboxBackend,
    spec: SandboxSpec,
    task: Task,
    runner: Callable[[Sandbox], CommandRunner],
    prepare: Callable[[Sandbox], None],
) -> GroupSetup:
    """Provision a sandbox of `template_spec(spec)`, lay `task`'s files (after `prepare`, which makes what
    provisioning makes of it: `/tests`), run its setup with `runner`, and freeze it (`backend.snapshot`); on a
    failed setup the sandbox is closed and the failure returned. The caller bounds it with its deadline; whatever
    ends it, nothing is left but the template it returns."""
    started = time.monotonic()
    sandbox = await backend.create(template_spec(spec))
    try:
        prepare(sandbox)
        for path, text in (task.files | task.outside_files).items():
            await sandbox.write_text(path, text)
        results: list[CommandResult] = []
        failure = await run_setup(runner(sandbox), task.setup, on_result=lambda _i, result: results.append(result))
    except BaseException:
        await shielded(sandbox.close())
        raise
    if failure is not None:
        await shielded(sandbox.close())
        return GroupSetup(None, tuple(results), failure, time.monotonic() - started)
    template = await backend.snapshot(sandbox)  # closes the sandbox, whatever happens
    return GroupSetup(template, tuple(results), None, time.monotonic() - started)


def group_size(setup: GroupSetup) -> int:
    """What the group registry charges `setup` (`sandbox.templates`: its bytes budget)."""
    return setup.size


async def release_setup(setup: GroupSetup) -> None:
    if setup.template is not None:
        await setup.template.release()
