"""run_rollout: RolloutRequest in, RolloutResult out.

    provision -> files -> setup -> agent -> verify -> score -> collect -> teardown

The sandbox, setup, verify, score and teardown are the workspace lifecycle's (`workspace.lifecycle`, shared
with interactive episodes). Verify runs where the request says (see `workspace.verify`): with declared `artifacts`, in a clean room (a fresh
sandbox with the task's files, set up again, the artifacts and the hidden `verify_files`), else in the agent's
workspace with the `verify_files` written over it. Either way only once the agent's tree is dead.

Each stage runs under its own deadline inside the rollout's deadline (their sum, see `budget`). What goes wrong
during a rollout is reported in the result (`status` + `error`), never raised; only a request this server will
not run at all raises `RequestError` before anything starts. Teardown always runs, shielded from cancellation,
and is bounded by its own deadline.

Everything a sandbox produces is untrusted (DESIGN.md): an unexpected exception (not one of our typed
failures) while verify or collect handles what the agent left is the agent's doing as far as anyone can tell,
so it never makes the rollout unscored: in verify it scores 0 with a note, in collect the files are omitted
with a note; the error is typed in the result either way. In the stages before the agent's output is read
(provision, setup) and in the agent's own stage it is an infra error like any failure of our machinery.

Cancellation: cancelling the task running `run_rollout` tears the sandbox down and re-raises. Setting the
optional `cancel` event instead ends the rollout early with status `cancelled` and returns the partial result.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable

from coding_agent_env.agents.base import Agent, AgentContext
from coding_agent_env.agents.registry import get_agent
from coding_agent_env.aio import shielded
from coding_agent_env.errors import (
    AgentError,
    RelayError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxFileNotRegularError,
)
from coding_agent_env.llm import Relay, RolloutLlm, SharedRelay, Upstream, access, resolve_upstream
from coding_agent_env.llm.failures import llm_failure
from coding_agent_env.llm.proxy_log import proxy_log
from coding_agent_env.llm.trace import annotate, training_data
from coding_agent_env.models import (
    AgentEvents,
    CommandResult,
    ErrorInfo,
    RolloutRequest,
    RolloutResult,
    RolloutStatus,
    Timings,
    Turn,
)
from coding_agent_env.models.results import StepResult
from coding_agent_env.rollout import events as ev
from coding_agent_env.rollout.collect import collect_files
from coding_agent_env.sandbox.base import RelayEndpoint, Sandbox, SandboxLimits, SandboxSpec
from coding_agent_env.sandbox.registry import Backends
from coding_agent_env.settings import Settings
from coding_agent_env.workspace.budget import Budget
from coding_agent_env.workspace.limits import resolve_limits
from coding_agent_env.workspace.lifecycle import Workspace
from coding_agent_env.workspace.steps import step_reward, step_rewards
from coding_agent_env.workspace.redact import Redactor
from coding_agent_env.workspace.verify.verification import CleanRoomSetupFailed
from coding_agent_env.workspace.writable import check_writable

__all__ = ["run_rollout"]

log = logging.getLogger(__name__)

_INFRA_ERRORS = (SandboxError, AgentError, RelayError, OSError)
"""Failures of our machinery (not of the task or the agent): the episode is invalid, reward null."""
_ON_AGENT_OUTPUT: frozenset[str] = frozenset({"verify", "collect"})
"""Stages that handle what the agent left: an unexpected exception there is scored, never an infra error."""


class _StageFailed(Exception):
    """Ends the pipeline early; the status and error are already recorded."""


async def run_rollout(
    request: RolloutRequest,
    *,
    settings: Settings | None = None,
    emit: ev.Emit | None = None,
    cancel: asyncio.Event | None = None,
    relay: Relay | SharedRelay | None = None,
    backends: Backends | None = None,
    caller: str | None = None,
) -> RolloutResult:
    """Run one rollout end to end. Raises `RequestError` only for a request that cannot start.

    An agent that needs an LLM talks to it through `relay` (the server's, on this loop: running, or started on
    first use); without one, a private relay lives for this rollout only (see `llm.access`). Its sandbox comes
    from `backends` (the server's); without them, those of `settings` are built for this rollout only. `caller`:
    who asks (a session's id), whose group templates are bounded together (`sandbox.templates`)."""
    if backends is None:
        async with Backends(settings or Settings.from_env()) as own:
            return await run_rollout(
                request, settings=own.settings, emit=emit, cancel=cancel, relay=relay, backends=own, caller=caller
            )
    settings = settings or backends.settings
    check_writable(request)
    if request.agent is None:
        request = request.model_copy(update={"agent": settings.default_agent})
    agent = get_agent(request.agent or settings.default_agent)
    agent.check_available(settings)
    backend_name = backends.resolve(request.sandbox)
    limits = resolve_limits(request, settings)
    await backends.check_usable(backend_name, network="llm" if agent.needs_llm and agent.llm_from_sandbox else None)
    upstream = resolve_upstream(request, settings) if agent.needs_llm else None
    rollout = _Rollout(request, settings, agent, backends, backend_name, emit)
    rollout.workspace.caller = caller
    rollout.limits = limits
    rollout.upstream, rollout.relay = upstream, relay
    if cancel is None:
        return await rollout.execute()
    return await _until_cancelled(rollout, cancel)


async def _until_cancelled(rollout: _Rollout, cancel: asyncio.Event) -> RolloutResult:
    task = asyncio.ensure_future(rollout.execute())
    waiter = asyncio.ensure_future(cancel.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        if not task.done():
            rollout.cancelled_by_request = True
            task.cancel()
            await asyncio.wait({task})
    if task.cancelled():
        return rollout.result()
    return task.result()


class _Rollout:
    """The mutable state of one rollout; `result()` renders it at any point. Its sandbox, setup, verify and
    teardown are its `workspace`'s (the lifecycle episodes share)."""

    def __init__(
        self,
        request: RolloutRequest,
        settings: Settings,
        agent: Agent,
        backends: Backends,
        backend: str,
        emit: ev.Emit | None,
    ) -> None:
        self.request = request
        self.settings = settings
        self.agent = agent
        self.backends = backends
        self.backend = backend
        self.rollout_id = uuid.uuid4().hex
        self.budget = Budget.for_request(request, settings)
        self._emit = emit
        self.workspace = Workspace(
            request, settings=settings, backends=backends, backend_name=backend,
            redact=Redactor([request.api_key.get_secret_value() if request.api_key else None]),
            label=f"rollout {self.rollout_id}",
        )
        self.upstream: Upstream | None = None
        self.relay: Relay | SharedRelay | None = None
        self.llm: RolloutLlm | None = None
        self.limits: SandboxLimits | None = None
        self.status = RolloutStatus.COMPLETED
        self.error: ErrorInfo | None = None
        self.reward: float | None = None
        self.reward_note: str | None = None
        self.agent_exit_code: int | None = None
        self.agent_log_tail = ""
        self.agent_events: AgentEvents | None = None
        self.files: dict[str, str] = {}
        self.files_extra: list[str] = []
        self.timings: dict[str, float] = {}
        self.cancelled_by_request = False
        self.steps: list[StepResult] = []

    # -- driving ---------------------------------------------------------------------------------------

    async def execute(self) -> RolloutResult:
        started = time.monotonic()
        self.emit(ev.RolloutStarted(rollout_id=self.rollout_id, agent=self.agent.name, sandbox=self.backend))
        try:
            async with asyncio.timeout(self.budget.total_s - self.budget.teardown_s):
                await self._stages()
        except _StageFailed:
            pass
        except TimeoutError:
            self.fail(RolloutStatus.INFRA_ERROR, "rollout", "RolloutTimeout", "the rollout's deadline passed")
        except Exception as exc:  # noqa: BLE001 - between the stages (revoking the LLM access, say): still a result
            log.exception("rollout %s: unexpected error", self.rollout_id)
            self.fail(RolloutStatus.INFRA_ERROR, "rollout", type(exc).__name__, str(exc) or type(exc).__name__)
        except asyncio.CancelledError:
            self.status, self.reward = RolloutStatus.CANCELLED, None
            self.error = ErrorInfo(type="Cancelled", stage="rollout", message="the rollout was cancelled")
            raise
        finally:
            await shielded(self._teardown())
            self.timings["total"] = time.monotonic() - started
            self.emit(ev.RolloutFinished(rollout_id=self.rollout_id, status=self.status, reward=self.reward))
        return self.result()

    async def _stages(self) -> None:
        await self.stage("provision", self.budget.provision_s, self._provision)
        await self.stage("setup", self.budget.setup_s, self._setup)
        if self.request.steps:
            await self._steps()
        else:
            await self.stage("agent", self.budget.agent_s, self._agent)
            # The agent's tree is dead: its token dies too, before verify runs anything the agent wrote (a token
            # left in a config file must not buy LLM calls, or turns, after the agent's phase). Outside the agent's
            # stage: revoking may wait a moment for cancelled calls to be recorded.
            if self.llm is not None:
                await self.llm.revoke()
            await self.stage("verify", self.budget.verify_s, self._verify)
        await self.stage("collect", self.budget.collect_s, self._collect)

    async def _steps(self) -> None:
        """A multi-step task: each step in order in the one sandbox (its files, setup, agent, verify), until the
        last or a gate; the reward is the task's `step_reward` of the steps verified. Between steps the agent's
        LLM access stays open (the next step's agent needs it); verify's commands never reach the relay on a
        backend whose `exec` has no network (local), and on others a call they make is recorded as a turn."""
        whole = self.request
        try:
            for step in whole.steps:
                self.request = whole.for_step(step)
                outcome = await self.workspace.enter_step(self.request, step.name)
                self.steps.append(outcome)
                await self.stage("setup", self.budget.setup_s, self._setup)
                self.status = RolloutStatus.COMPLETED  # the last step's agent says how the rollout's ended
                await self.stage("agent", self.budget.agent_s, self._agent)
                outcome.agent_exit_code = self.agent_exit_code
                outcome.agent_timed_out = self.status is RolloutStatus.AGENT_TIMEOUT
                await self.stage("verify", self.budget.verify_s, self._verify)
                self.workspace.close_step(outcome, step.min_reward)
                if outcome.gate is not None:
                    break
        finally:
            self.request = whole
            if self.llm is not None:
                await self.llm.revoke()
        self.reward, self.reward_note = step_reward(self.steps, whole.step_reward, len(whole.steps))

    async def stage(self, phase: ev.Phase, budget_s: float, body: Callable[[], Awaitable[None]]) -> None:
        """Run one stage under its deadline; infrastructure failures end the rollout as infra_error."""
        self.emit(ev.PhaseStarted(rollout_id=self.rollout_id, phase=phase))
        started = time.monotonic()
        try:
            async with asyncio.timeout(budget_s):
                await body()
        except TimeoutError:
            self.fail(RolloutStatus.INFRA_ERROR, phase, "StageTimeout", f"the {phase} stage passed its deadline")
            raise _StageFailed from None
        except _StageFailed:
            raise  # the body recorded why
        except _INFRA_ERRORS as exc:
            self.fail(RolloutStatus.INFRA_ERROR, phase, type(exc).__name__, str(exc))
            raise _StageFailed from exc
        except Exception as exc:  # noqa: BLE001 - typed into the result, never raised out of the rollout
            log.exception("rollout %s: unexpected error in the %s stage", self.rollout_id, phase)
            if phase not in _ON_AGENT_OUTPUT:
                self.fail(RolloutStatus.INFRA_ERROR, phase, type(exc).__name__, str(exc) or type(exc).__name__)
                raise _StageFailed from exc
            self.on_agent_output_failed(phase, exc)
        finally:
            self.timings[phase] = time.monotonic() - started
            self.emit(ev.PhaseFinished(rollout_id=self.rollout_id, phase=phase, duration_s=self.timings[phase]))

    def on_agent_output_failed(self, phase: str, exc: Exception) -> None:
        """An unexpected exception while `phase` handled what the agent left (see the module docstring): typed in
        `error`; verify scores 0 (with a reward of null the agent would have escaped its score), collect omits."""
        kind = type(exc).__name__
        self.error = ErrorInfo(type=kind, stage=phase, message=self.workspace.redact.text(str(exc) or kind))
        if phase == "verify":
            self.reward = 0.0
            self.reward_note = f"verify could not complete on what the agent left ({kind}): scored 0"
        else:
            self.files_extra = [*self.files_extra, f"... (collecting failed on what the agent left: {kind})"]

    def fail(self, status: RolloutStatus, stage: str, kind: str, message: str) -> None:
        self.status, self.reward = status, None
        self.error = ErrorInfo(type=kind, stage=stage, message=self.workspace.redact.text(message))

    def emit(self, event: ev.RolloutEvent) -> None:
        if self._emit is None:
            return
        try:
            self._emit(event)
        except Exception:
            # A broken progress listener (a closed UI, say) must not change the rollout's outcome.
            log.exception("rollout %s: emit callback failed", self.rollout_id)

    # -- stages ----------------------------------------------------------------------------------------

    async def _provision(self) -> None:
        relay = await self._open_llm()
        agents = self.settings.agents_dir
        spec = SandboxSpec(
            rollout_id=self.rollout_id,
            image=self.request.image,
            network="none" if relay is None else "llm",
            relay=relay,
            agents_dir=str(agents) if relay is not None and agents.is_dir() else None,
            limits=self.limits,
            env=self.request.env,
            deadline_s=self.budget.total_s,
        )

        def created(sandbox: Sandbox) -> None:
            self.emit(ev.Provisioned(rollout_id=self.rollout_id, sandbox_id=sandbox.id, isolation=sandbox.isolation))

        solution = self.agent.name == "oracle" and (
            bool(self.request.solution_files) or any(step.solution_files for step in self.request.steps)
        )
        await self.workspace.provision(spec, created=created, solution=solution)

    async def _open_llm(self) -> RelayEndpoint | None:
        """Open the LLM access of an agent that needs one; returns the relay its sandbox must reach, if any."""
        if self.upstream is None:
            return None
        opening = access(
            self.relay,
            self.rollout_id,
            self.upstream,
            settings=self.settings,
            ttl_s=self.budget.total_s,
            from_sandbox=self.agent.llm_from_sandbox,
        )
        self.llm = await self.workspace.resources.enter_async_context(opening)
        self.workspace.redact = Redactor([*self.llm.secrets, *self.workspace.redact.secrets])
        return self.llm.sandbox_relay

    async def _setup(self) -> None:
        def record(index: int, result: CommandResult) -> None:
            self.emit(ev.CommandFinished(rollout_id=self.rollout_id, phase="setup", index=index, result=result))

        failure = await self.workspace.set_up(record)
        if failure is not None:
            self.fail(RolloutStatus.SETUP_FAILED, "setup", "SetupCommandFailed", failure.message)
            raise _StageFailed

    async def _agent(self) -> None:
        sandbox = self._open_sandbox()
        agent_dir = f"{sandbox.paths.logs}/agent"
        ctx = AgentContext(
            request=self.request,
            sandbox=sandbox,
            settings=self.settings,
            instruction_path=f"{agent_dir}/instruction.md",
            agent_dir=agent_dir,
            log_path=f"{agent_dir}/agent.log",
            llm=self.llm.for_agent(sandbox.relay_url) if self.llm is not None else None,
        )
        await sandbox.write_text(ctx.instruction_path, self.request.instruction)
        timed_out = False
        try:
            async with asyncio.timeout(self.request.agent_timeout_s):
                self.agent_exit_code = await self.agent.run(ctx)
        except TimeoutError:
            timed_out = True
            self.status = RolloutStatus.AGENT_TIMEOUT
        else:
            if self.agent_exit_code != 0:
                self.status = RolloutStatus.AGENT_FAILED
        finally:
            self.agent_events = self.agent.events()
            await self._read_agent_log(ctx.log_path)
        self.emit(ev.AgentFinished(rollout_id=self.rollout_id, exit_code=self.agent_exit_code, timed_out=timed_out))

    async def _read_agent_log(self, path: str) -> None:
        own = self.agent.log_tail(self.settings.agent_log_tail_bytes)
        if own is not None:
            self.agent_log_tail = own
            return
        sandbox = self._open_sandbox()
        try:
            self.agent_log_tail = await sandbox.read_text(path, max_bytes=self.settings.agent_log_tail_bytes, tail=True)
        except SandboxFileNotFoundError:
            self.agent_log_tail = ""
        except SandboxError as exc:
            # The agent's own output: a FIFO, a directory or a symlink in its place is noted, never opened.
            why = "not a regular file" if isinstance(exc, SandboxFileNotRegularError) else str(exc)
            self.agent_log_tail = f"[coding-agent-env] the agent's log was not read: {self.workspace.redact.text(why)}\n"

    async def _verify(self) -> None:
        def record(index: int, result: CommandResult) -> None:
            self.emit(ev.CommandFinished(rollout_id=self.rollout_id, phase="verify", index=index, result=result))

        try:
            await self.workspace.verify(on_result=record)
        except CleanRoomSetupFailed as exc:
            self.fail(RolloutStatus.SETUP_FAILED, "verify", "CleanRoomSetupFailed", exc.message)
            raise _StageFailed from None
        verification = self.workspace.verification
        self.reward, self.reward_note = verification.reward, verification.reward_note

    async def _collect(self) -> None:
        collected = await collect_files(self._open_sandbox(), self.settings)
        self.files, self.files_extra = collected.files, collected.omitted

    async def _teardown(self) -> None:
        if self.workspace.sandbox is None and self.llm is None:
            return
        self.emit(ev.PhaseStarted(rollout_id=self.rollout_id, phase="teardown"))
        started = time.monotonic()
        try:
            failure = await self.workspace.close()
            if failure is not None and self.error is None:
                self.error = failure
        finally:
            self.timings["teardown"] = time.monotonic() - started
            self.emit(ev.PhaseFinished(rollout_id=self.rollout_id, phase="teardown", duration_s=self.timings["teardown"]))

    def _open_sandbox(self) -> Sandbox:
        return self.workspace.open_sandbox()

    # -- result ----------------------------------------------------------------------------------------

    def result(self) -> RolloutResult:
        if self.cancelled_by_request:
            self.status, self.reward = RolloutStatus.CANCELLED, None
            self.error = ErrorInfo(type="Cancelled", stage="rollout", message="the rollout was cancelled")
        turns = self.llm.turns() if self.llm is not None else []
        timings = Timings(**{f"{phase}_s": round(seconds, 6) for phase, seconds in self.timings.items()},
                          llm_s=round(_llm_seconds(turns), 6))
        if self.error is None:  # the LLM calls' failure, whatever the agent's exit code (llm.failures)
            self.error = llm_failure(turns, self.request.mode)
        task_id = self.request.task_id or ""
        fields = self.workspace.report_fields()
        if self.steps:  # the task's metrics are its steps', by the task's rule (the workspace holds the last's)
            fields["rewards"] = step_rewards(self.steps, self.request.step_reward) if self.reward is not None else None
        raw = RolloutResult(
            **fields,
            rollout_id=self.rollout_id,
            task_id=task_id,
            agent=self.agent.name,
            sandbox_id=self.workspace.sandbox.id if self.workspace.sandbox else "",
            mode=self.request.mode,
            status=self.status,
            reward=self.reward,
            reward_note=self.reward_note,
            agent_exit_code=self.agent_exit_code,
            files=self.files,
            files_extra=self.files_extra,
            proxy_turns=turns,
            timings=timings,
            wall_s=timings.total_s,
            agent_log_tail=self.agent_log_tail,
            proxy_log_tail=proxy_log(turns, self.settings.agent_log_tail_bytes),
            agent_events=self.agent_events,
            steps=self.steps,
            error=self.error.line() if self.error is not None else None,
            error_detail=self.error,
        )
        # Always, even with no secret to remove: a file name read back may hold undecodable bytes (as surrogate
        # escapes), and a model's text lone surrogates, which no JSON encoder would take (about 0.1 ms).
        result = RolloutResult.model_validate(self.workspace.redact.deep(raw.model_dump(mode="json")))
        # The graph and the trace are built from the redacted turns: their numbers hold no secret, and their few
        # strings come from those turns and the redacted task id.
        annotated, graph = annotate(result.proxy_turns, self.rollout_id)
        if not any(node.by_ids for node in graph.nodes):
            return result.model_copy(update={"proxy_turns": annotated})
        training = training_data(graph, rollout_id=self.rollout_id, task_id=result.task_id, reward=result.reward)
        return result.model_copy(update={"proxy_turns": annotated, "training": training})


def _llm_seconds(turns: list[Turn]) -> float:
    """The time covered by the calls' intervals (`timestamp`, `latency_s`), overlaps counted once: what the agent
    spent waiting on its LLM, also when it made calls side by side."""
    spans = sorted((t.timestamp, t.timestamp + max(t.latency_s, 0.0)) for t in turns if t.timestamp > 0)
    total, end = 0.0, float("-inf")
    for start, stop in spans:
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total
