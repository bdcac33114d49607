"""`Workspace`: one task's sandbox from provision to teardown, driven by a rollout or an interactive episode.

    provision(spec)  the sandbox made as the task declares it (its workdir, the directories it claims, `/tests`
                     when it has hidden tests there, other users when it names them: `task_spec`; a backend
                     that cannot honour one refuses), closed at teardown; the task's files written. A member of
                     a group (`Task.group_id`) is forked from its group's set-up template where the backend can
                     (the first member's start makes it: `workspace.group`), and reports how (`group`)
    set_up()         the task's setup commands, in order, to the first failure (results kept); a forked member's
                     are its template's (they ran once, there), as is a group's failure
    runner()         the task-command runner the driver's own commands may use (deadline, output cap, redaction)
    verify()         once no process the driver started is alive: verify in the workspace or a clean room, and
                     the score (`verify.verification`); `verification` is filled as it goes
    close()          teardown: the sandbox's limits_hit read, then what it holds released, last acquired first;
                     once (later calls wait for the same teardown), shielded from cancellation, bounded by
                     `teardown_timeout_s`; a failure is returned typed, never raised
    report_fields()  what every result reports of it (`models.WorkspaceReport`'s fields but the reward)

What goes wrong while it runs is raised to the driver, which owns the status and the error of its result (a
rollout's `RolloutStatus`, an episode's `EpisodeStatus`); only teardown's failure is returned, so that a
result always goes out.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

from coding_agent_env.aio import shielded
from coding_agent_env.errors import SandboxUnsupportedError
from coding_agent_env.models import CommandResult, ErrorInfo, GroupReport, Task
from coding_agent_env.models.results import StepResult
from coding_agent_env.models.task import SOLUTION_ROOT
from coding_agent_env.sandbox.base import Sandbox, SandboxBackend, SandboxSpec
from coding_agent_env.sandbox.registry import Backends
from coding_agent_env.sandbox.templates import TemplateBoundError
from coding_agent_env.settings import Settings
from coding_agent_env.workspace.budget import Budget
from coding_agent_env.workspace.commands import CommandRunner
from coding_agent_env.workspace.group import GroupSetup, group_key, group_size, make_template, release_setup
from coding_agent_env.workspace.redact import Redactor
from coding_agent_env.workspace.setup import SetupFailure, run_setup
from coding_agent_env.workspace.steps import gate
from coding_agent_env.workspace.verify.run import tests_dir
from coding_agent_env.workspace.verify.verification import Verification, VerifyPlan, verify_task

__all__ = ["OnResult", "Workspace", "task_spec"]

log = logging.getLogger(__name__)

OnResult = Callable[[int, CommandResult], None]
"""Told each command's result (its index in its list) as it ends."""


def _ignore(index: int, result: CommandResult) -> None:
    return None


def task_spec(task: Task, spec: SandboxSpec, *, solution: bool = False) -> SandboxSpec:
    """`spec` with what `task` declares of its sandbox: its workdir, the top directories of its outside files
    (and `/solution` with `solution`: the oracle's), `/tests` when its hidden tests go there (a task without
    them sees no `/tests`), and other users when it names one."""
    roots = [root for root in task.writable_roots() if root != task.workdir]
    if solution:
        roots.append(SOLUTION_ROOT)
    hidden_tests = task.verify_files_root == "/tests"
    return dataclasses.replace(
        spec,
        workdir=task.workdir,
        writable_roots=tuple(sorted(set(roots))),
        tests=hidden_tests,
        users=task.agent_user is not None or task.verify_user is not None,
    )


@dataclass(eq=False)
class Workspace:
    """See the module docstring. `label` names it in logs ("rollout <id>", "episode <id>"); its sandbox comes
    from `backends`' backend `backend_name` (resolved and checked usable by the driver)."""

    task: Task
    settings: Settings
    backends: Backends
    backend_name: str
    redact: Redactor
    """Applied to every command's result and every error; a driver that learns more secrets replaces it."""
    label: str
    caller: str | None = None
    """Who asks (a session's id; None: no caller, as a one-off run): group templates are bounded per caller."""
    sandbox: Sandbox | None = field(default=None, init=False)
    spec: SandboxSpec | None = field(default=None, init=False)
    setup_results: list[CommandResult] = field(default_factory=list, init=False)
    verification: Verification = field(default_factory=Verification, init=False)
    limits_hit: list[str] = field(default_factory=list, init=False)
    resources: AsyncExitStack = field(default_factory=AsyncExitStack, init=False)
    """What teardown releases, last acquired first; a driver may enter its own before provision (a rollout's LLM
    access: released after the sandbox is closed)."""
    group: GroupReport | None = field(default=None, init=False)
    """A member of a group: how it got its set-up state."""
    _closing: asyncio.Future[ErrorInfo | None] | None = field(default=None, init=False)
    _step_setup_from: int = field(default=0, init=False)
    _group_setup: GroupSetup | None = field(default=None, init=False)
    """The group's setup that stands for this member's own (once: a multi-step task's later setups run)."""

    # -- the stages ------------------------------------------------------------------------------------

    async def provision(
        self, spec: SandboxSpec, *, created: Callable[[Sandbox], None] | None = None, solution: bool = False
    ) -> Sandbox:
        """Make the sandbox as the task declares it (`task_spec`; `solution`: with `/solution`, for the oracle;
        `created` is told as soon as it exists), refuse before anything runs a task whose hidden tests it could
        not show (`SandboxError`), write the task's files: `files` in the workdir, `outside_files` at their
        paths."""
        self.spec = spec = task_spec(self.task, spec, solution=solution)
        forked = await self._fork_member(spec) if self.task.group_id is not None else None
        self.sandbox = sandbox = forked or await self.backend().create(spec)
        self.resources.push_async_callback(sandbox.close)
        if self.task.verify_files_root == "/tests":
            tests_dir(sandbox)
        if created is not None:
            created(sandbox)
        if forked is None:
            for path, text in (self.task.files | self.task.outside_files).items():
                await sandbox.write_text(path, text)
        return sandbox

    async def _fork_member(self, spec: SandboxSpec) -> Sandbox | None:
        """A group member's sandbox, forked from its group's template (made first if this member is the first);
        None when the member is to be made as any sandbox (its backend cannot fork, or the group's setup failed:
        then `set_up` reports that failure). The member holds the template until its teardown."""
        assert self.task.group_id is not None
        backend = self.backend()
        await backend.refusal()  # probes the backend off the loop once, before fork_refusal reads what it found
        refusal = "the task has no setup to share" if not self.task.setup else backend.fork_refusal(spec)
        if refusal is not None:
            self.group = GroupReport(group_id=self.task.group_id, setup="per_member", note=refusal)
            return None
        task = self.task
        # A member's provisioning is the template's (a sandbox, the setup, the snapshot) and then its own fork.
        deadline_s = Budget.for_request(task, self.settings).provision_s - self.settings.provision_timeout_s

        def prepare(sandbox: Sandbox) -> None:
            if task.verify_files_root == "/tests":
                tests_dir(sandbox)

        async def make() -> GroupSetup:
            async with asyncio.timeout(deadline_s):
                return await make_template(backend, spec, task, self.runner, prepare)

        try:
            lease = self.backends.templates.join(group_key(task, spec, self.backend_name), make, release_setup,
                                                 caller=self.caller, size=group_size, members=task.group_size)
        except TemplateBoundError as exc:  # nothing made: this member sets up on its own, as any sandbox
            self.group = GroupReport(group_id=task.group_id, setup="per_member", note=str(exc))
            return None
        self.resources.callback(lease.leave)  # after the member's sandbox is closed (last acquired first)
        try:
            made = await lease.value()
        except SandboxUnsupportedError as exc:  # the backend found out only when freezing (an image's VOLUME)
            self.group = GroupReport(group_id=task.group_id, setup="per_member", note=str(exc))
            return None
        self._group_setup = made
        self.group = GroupReport(
            group_id=task.group_id, setup="forked", made_here=lease.created, template_setup_s=made.setup_s,
            template=made.template.id if made.template is not None else None,
            method=made.template.method if made.template is not None else None,
        )
        if made.template is None:
            return None
        started = asyncio.get_running_loop().time()
        sandbox = await backend.fork(spec, made.template)
        self.group.fork_s = asyncio.get_running_loop().time() - started
        return sandbox

    async def set_up(self, on_result: OnResult = _ignore) -> SetupFailure | None:
        """The task's setup commands (each result kept and told to `on_result`); the first failure, or None."""

        def record(index: int, result: CommandResult) -> None:
            self.setup_results.append(result)
            on_result(index, result)

        group, self._group_setup = self._group_setup, None
        if group is not None:  # ran once, in the group's template
            for index, result in enumerate(group.results):
                record(index, result)
            return group.failure
        return await run_setup(self.runner(), self.task.setup, on_result=record)

    def runner(self, sandbox: Sandbox | None = None) -> CommandRunner:
        """The task-command runner for `sandbox` (default: the workspace's own): setup's and verify's commands,
        as the task's `verify_user`."""
        return CommandRunner(
            sandbox or self.open_sandbox(), self.task.command_timeout_s, self.settings.max_output_bytes, self.redact,
            user=self.task.verify_user,
        )

    async def verify(
        self,
        *,
        on_result: OnResult = _ignore,
        env: Mapping[str, str] | None = None,
        prepare: Callable[[Sandbox], Awaitable[None]] | None = None,
    ) -> None:
        """Verify and score (see `verify.verification.verify_task`; `CleanRoomSetupFailed` when the task's setup
        fails again in a clean room). `env` is added to each verify command's environment; `prepare` is called
        with the sandbox verify will run in, just before it does."""
        assert self.spec is not None, "verify ran before provision"
        plan = VerifyPlan(
            task=self.task, backend=self.backend(), spec=self.spec, settings=self.settings, runner=self.runner,
            on_result=on_result, env=env or {}, prepare=prepare,
        )
        try:
            await verify_task(self.open_sandbox(), plan, self.verification)
        finally:
            self.limits_hit += self.verification.limits_hit

    # -- a multi-step task's steps ------------------------------------------------------------------------

    async def enter_step(self, task: Task, name: str) -> StepResult:
        """Make `task` (the whole task as one step runs it: `Task.for_step`) the workspace's task, lay its files
        into the workdir (over what the steps before left) and start its record; verify then checks this step."""
        self.task = task
        self.verification = Verification()
        self._step_setup_from = len(self.setup_results)
        for path, text in task.files.items():
            await self.open_sandbox().write_text(path, text)
        return StepResult(name=name)

    def close_step(self, step: StepResult, min_reward: float | Mapping[str, float] | None) -> None:
        """Fill `step`'s record from what its setup and verify did, and its gate."""
        step.setup_results = self.setup_results[self._step_setup_from:]
        step.verify_results = list(self.verification.results)
        step.reward, step.reward_note = self.verification.reward, self.verification.reward_note
        step.rewards = self.verification.rewards
        step.gate = gate(step, min_reward)

    # -- teardown --------------------------------------------------------------------------------------

    async def close(self) -> ErrorInfo | None:
        """Tear down (see the module docstring); the failure, typed, if it failed."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._teardown())
        return await shielded(self._closing)

    async def _teardown(self) -> ErrorInfo | None:
        try:
            async with asyncio.timeout(self.settings.teardown_timeout_s):
                try:
                    if self.sandbox is not None and not self.sandbox.closed:
                        self.limits_hit = [*await self.sandbox.limits_hit(), *self.limits_hit]
                finally:
                    # The sandbox first, then what the driver held before it (a rollout's LLM access: its token
                    # revoked and its turns kept), even when the sandbox's close failed.
                    await self.resources.aclose()
        except Exception as exc:  # noqa: BLE001 - a sandbox-made tree, say: the result still goes out
            log.error("%s: teardown failed: %r", self.label, exc)
            return ErrorInfo(type=type(exc).__name__, stage="teardown", message=self.redact.text(str(exc)))
        return None

    # -- facts -----------------------------------------------------------------------------------------

    def backend(self) -> SandboxBackend:
        return self.backends.get(self.backend_name)

    def open_sandbox(self) -> Sandbox:
        assert self.sandbox is not None, "used before provision"
        return self.sandbox

    def report_fields(self) -> dict[str, Any]:
        """`models.WorkspaceReport`'s fields as this workspace has them, but `reward` and `reward_note` (the
        driver's: a status may void the score)."""
        sandbox, verification = self.sandbox, self.verification
        return {
            "sandbox": self.backend_name,
            "isolation": sandbox.isolation if sandbox else None,
            "network": sandbox.network if sandbox else None,
            "limits": dict(sandbox.limits) if sandbox else {},
            "limit_scopes": dict(sandbox.limit_scopes) if sandbox else {},
            "limits_hit": self.limits_hit,
            "setup_results": self.setup_results,
            "verify_results": verification.results,
            "verify_context": verification.context,
            "artifacts": verification.artifacts,
            "rewards": verification.rewards,
            "group": self.group,
        }
