"""Verify a task once every process the agent started is dead, and score it: one path for rollouts and
interactive episodes.

Where verify runs follows the task (see `cleanroom`): with declared `artifacts`, in a clean room (a fresh
sandbox of the same backend and image with the task's files, set up again, the artifacts and the hidden
`verify_files`), closed again shielded; otherwise in the agent's workspace with the `verify_files` written
over it. `run_verify` clears the reward files first and runs each command in a fresh context, hardened unless
the task says `verify_hardening: false`; `score` turns the outcome into the reward (and the named metrics of a
`reward.json`: `rewards`). In a hardened clean room a reward file counts only when the task declares one
(`reward_file_required`); otherwise the reward is the verify commands' exit codes, which the artifacts cannot
forge (see `_reward_file_uncounted`).

`Verification` is filled as verify goes, so a caller whose deadline cuts verify short still reports what ran
(the context, the artifacts taken, the results so far). A clean room whose setup fails raises
`CleanRoomSetupFailed` (the episode is then invalid: the caller reports it, reward null).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from coding_agent_env.aio import shielded
from coding_agent_env.models import ArtifactReport, CommandResult, Task, VerifyContext
from coding_agent_env.workspace.verify.score import score
from coding_agent_env.workspace.verify.cleanroom import (
    ArtifactCaps,
    collect_artifacts,
    furnish,
    open_clean_room,
    place_verify_files,
)
from coding_agent_env.workspace.commands import CommandRunner
from coding_agent_env.workspace.setup import run_setup
from coding_agent_env.workspace.verify.run import run_verify, tests_dir
from coding_agent_env.sandbox.base import Sandbox, SandboxBackend, SandboxSpec
from coding_agent_env.settings import Settings

__all__ = ["CleanRoomSetupFailed", "Verification", "VerifyPlan", "verify_task"]


class CleanRoomSetupFailed(Exception):
    """The task's setup failed when run again in the clean room; `message` says which command and how."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass
class Verification:
    """What verify did so far."""

    context: VerifyContext | None = None
    artifacts: ArtifactReport | None = None
    results: list[CommandResult] = dataclasses.field(default_factory=list)
    reward: float | None = None
    reward_note: str | None = None
    rewards: dict[str, float] | None = None
    """Every named metric of the `reward.json` the reward was read from (`score.Score.rewards`); None when none
    was. Set with `reward`, once verify's commands have all run."""
    limits_hit: list[str] = dataclasses.field(default_factory=list)
    """Limits the clean room ran into (its own sandbox's; the caller adds its own)."""


@dataclass(frozen=True)
class VerifyPlan:
    """What verify needs from its caller."""

    task: Task
    backend: SandboxBackend
    """The backend of the agent's sandbox (a clean room is made by it)."""
    spec: SandboxSpec
    """The agent's sandbox's spec (a clean room is made like it, without network)."""
    settings: Settings
    runner: Callable[[Sandbox], CommandRunner]
    """The task-command runner for a sandbox (deadline, output cap, redaction)."""
    on_result: Callable[[int, CommandResult], None]
    """Each verify command's result as it ends."""
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Added to each verify command's environment (beside `REWARD_FILE`)."""
    prepare: Callable[[Sandbox], Awaitable[None]] | None = None
    """Called with the sandbox verify will run in, just before it does (e.g. to write a final answer)."""


async def verify_task(sandbox: Sandbox, plan: VerifyPlan, out: Verification) -> None:
    """Verify the task whose agent worked in `sandbox` (none of its processes alive), filling `out`."""
    if not plan.task.artifacts:
        out.context = "workspace"
        await _place(sandbox, plan.task)
        await _run(sandbox, plan, out)
        return
    out.context = "clean_room"
    taken = await collect_artifacts(sandbox, plan.task.artifacts, ArtifactCaps.from_settings(plan.settings))
    out.artifacts = taken.report
    room = await open_clean_room(plan.backend, plan.spec, files=plan.task.files | plan.task.outside_files)
    try:
        failure = await run_setup(plan.runner(room), plan.task.setup)
        if failure is not None:
            raise CleanRoomSetupFailed(f"{failure.message} in the clean room: {failure.result.stderr[-500:]}")
        await furnish(room, taken.data, {} if _under_tests(plan.task) else plan.task.verify_files)
        if _under_tests(plan.task):
            await _place(room, plan.task)
        await _run(room, plan, out)
    finally:
        await shielded(_close_room(room, out))


def _under_tests(task: Task) -> bool:
    return task.verify_files_root == "/tests"


async def _place(sandbox: Sandbox, task: Task) -> None:
    """The hidden verify files where the task wants them. Under `/tests` the whole directory behind it is
    removed and made anew first, so nothing the agent put there survives."""
    if not _under_tests(task):
        await place_verify_files(sandbox, task.verify_files)
        return
    root = tests_dir(sandbox)
    await sandbox.remove(root)
    await sandbox.mkdir(root)
    await place_verify_files(sandbox, {f"{root}/{path}": text for path, text in task.verify_files.items()}, clear=False)


async def _close_room(room: Sandbox, out: Verification) -> None:
    try:
        out.limits_hit += [f"in the clean room: {hit}" for hit in await room.limits_hit()]
    finally:
        await room.close()


async def _run(sandbox: Sandbox, plan: VerifyPlan, out: Verification) -> None:
    if plan.prepare is not None:
        await plan.prepare(sandbox)

    def record(index: int, result: CommandResult) -> None:
        out.results.append(result)
        plan.on_result(index, result)

    task = plan.task
    outcome = await run_verify(
        plan.runner(sandbox), task.verify, on_result=record, env=plan.env, hardened=task.verify_hardening,
        task_roots=plan.spec.writable_roots,
        uncounted_reward_file=_UNCOUNTED if _reward_file_uncounted(task, out) else None,
    )
    scored = score(outcome.results, outcome.reward_text, file_required=task.reward_file_required,
                   reward_json=outcome.reward_json, metric=task.reward_metric)
    out.reward, out.rewards = scored.reward, scored.rewards
    out.reward_note = _with_hint(outcome.reward_problem or scored.note, task, outcome.results,
                                 guarded=sandbox.path_guard is not None)
    if task.reward_file_required and outcome.reward_problem:
        out.reward = 0.0


_UNCOUNTED = ("the task declares none (reward_file_required) and verify ran the agent's artifacts, which could "
              "have written it; the reward is the verify commands' exit codes")


def _reward_file_uncounted(task: Task, out: Verification) -> bool:
    """Whether a reward file is not counted: in a hardened clean room, unless the task declares one. There the
    artifacts are the agent's code and verify runs them as the same user as its own commands, so whatever the
    verifier's exit status says, the artifact could write the file first (and kill its verifier)."""
    return task.verify_hardening and out.context == "clean_room" and not task.reward_file_required


_GUARDED_PATH_HINT = (
    "verify ran hardened: Python imports the standard library and installed packages first, the workdir (or a "
    "script's directory) after them, so a module of the agent's named like one of those (test.py, queue.py) is "
    "not the one imported, and the task's own PYTHONPATH is not used; a verify command that needs either puts it "
    "on the path itself (sys.path.insert(0, ...)), or the task sets verify_hardening: false"
)
_SAFE_PATH_HINT = (
    "verify ran hardened (PYTHONSAFEPATH=1; this sandbox has no path guard): Python does not import from the "
    "workdir by itself; a verify command that needs to puts it on the path (sys.path.append(os.getcwd()), "
    "`python3 -m unittest discover -s .`), or the task sets verify_hardening: false"
)
_IMPORT_FAILURES = ("No module named", "cannot import name")


def _with_hint(note: str | None, task: Task, results: list[CommandResult], *, guarded: bool) -> str | None:
    """`note`, and a hint when a hardened verify command failed on an import: the order of Python's path (or,
    without a path guard, the workdir missing from it) is a likely cause, and it is nowhere else in the result."""
    failed = any(not r.ok and any(text in r.stderr for text in _IMPORT_FAILURES) for r in results)
    if not (task.verify_hardening and failed):
        return note
    hint = _GUARDED_PATH_HINT if guarded else _SAFE_PATH_HINT
    return hint if note is None else f"{note}; {hint}"
