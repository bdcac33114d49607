"""One interactive episode: reset(task) -> terminal commands in a persistent shell -> final answer -> verify.

    start:        provision -> files -> setup -> shell   (first setup failure: setup_failed, torn down)
    terminal:     one command in the episode's shell     (its state and background jobs kept between commands)
    keystrokes:   keys typed into a live shell           (a REPL, a prompt), and the output after `duration`
    final_answer: every process ended -> answer to $FINAL_ANSWER_FILE -> verify -> score -> teardown

Contract:
- `Episode.start` raises `RequestError` only for a task this server will not run (unknown backend, limits over
  the caps), before anything is made. Whatever goes wrong after that is the episode's status and `error`.
- Commands run in one live shell (`sandbox.shell.live`) started after setup, as the task's agent user:
  everything a shell keeps carries over, background jobs live until the episode ends, a command's
  `command_timeout_s` interrupts its foreground job only (the result's `note` says how), and `keystrokes`
  reaches interactive programs. Attached with pipes where the backend can (local: a command is a pipe round
  trip), else on FIFOs with one exec per request (Docker, the remote backends). Where no live shell can start,
  each command is one sandbox exec (`sandbox.shell.sandboxed`; the working directory and exported variables
  carry over, background processes end with their command) and `keystrokes` is refused. The report's `shell`
  says which. Output is
  bounded in the sandbox either way (`episode_max_output_bytes`). The final answer first ends the shell and
  every process it left, so verify runs after every process the episode started is dead, in a fresh context,
  with the reward file cleared first, through the workspace lifecycle a rollout uses (`workspace.lifecycle`:
  hidden verify files, the clean room when artifacts are declared, the same reward rule). The answer is written
  where verify reads it, `$FINAL_ANSWER_FILE`.
- Calls run one at a time (`EpisodeBusyError`); after the episode ended each is refused (`EpisodeDoneError`).
- Deadlines: the episode's total (`episode_timeout_s`, from start) bounds every stage and command; a watchdog
  ends it at that deadline or after `episode_idle_timeout_s` without a call (`expired`). Provision, setup and
  verify each also have their own stage budget (`workspace.budget`).
- `on_end(status)` (given to `start`) hears how the episode ended, once, when it ends (whatever ends it); one
  that raises is logged and ignored.
- Teardown (the sandbox closed) runs once, shielded from cancellation, bounded by `teardown_timeout_s`;
  `close()` cancels a call in flight first and is idempotent.
- Nothing the episode's commands leave raises out of it (DESIGN.md, "Everything a sandbox produces is
  untrusted"): an unexpected exception while verify handles what they left scores 0 with a note and a typed
  `error`, never an unscored episode; one in provision, setup or a command ends the episode as infra_error,
  torn down, with the error typed.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Literal, TypeVar

from coding_agent_env.aio import shielded
from coding_agent_env.episode.errors import EpisodeBusyError, EpisodeDoneError, KeystrokesUnsupportedError
from coding_agent_env.episode.report import CallStats, CommandRecord, EpisodeReport, EpisodeStatus, TerminalResult
from coding_agent_env.errors import SandboxError, SandboxUnsupportedError
from coding_agent_env.models import ErrorInfo, Task
from coding_agent_env.sandbox.base import Sandbox, SandboxSpec
from coding_agent_env.sandbox.registry import Backends
from coding_agent_env.sandbox.shell.live import LiveShell, LiveShellError
from coding_agent_env.sandbox.shell.sandboxed import SandboxShell
from coding_agent_env.settings import Settings
from coding_agent_env.workspace.budget import Budget
from coding_agent_env.workspace.limits import resolve_limits
from coding_agent_env.workspace.lifecycle import Workspace
from coding_agent_env.workspace.redact import Redactor
from coding_agent_env.workspace.verify.verification import CleanRoomSetupFailed

__all__ = ["Episode"]

log = logging.getLogger(__name__)

T = TypeVar("T")
_INFRA_ERRORS = (SandboxError, OSError)
"""Failures of our machinery: the episode ends as infra_error, reward null."""
_SHOWN_COMMAND_CHARS = 200


class Episode:
    """See the module docstring. Lives on one event loop; build it with `Episode.start`."""

    def __init__(self, task: Task, *, settings: Settings, backends: Backends, episode_id: str | None,
                 on_end: Callable[[str], None] | None = None) -> None:
        self.task = task
        self._on_end = on_end
        self.settings = settings
        self.backends = backends
        self.backend = backends.resolve(task.sandbox)
        self.limits = resolve_limits(task, settings)
        self.id = episode_id if episode_id is not None else uuid.uuid4().hex
        self.workspace = Workspace(task, settings=settings, backends=backends, backend_name=self.backend,
                                   redact=Redactor([]), label=f"episode {self.id}")
        self.budget = Budget.for_request(task, settings)
        loop = asyncio.get_running_loop()
        self.deadline = loop.time() + settings.episode_timeout_s
        self.last_active = loop.time()
        self.status = EpisodeStatus.RUNNING
        self.error: ErrorInfo | None = None
        self.step_count = 0
        self.shell: LiveShell | SandboxShell | None = None
        self.shell_kind: Literal["live", "per_command"] | None = None
        self._shell_dir = ""
        self.history: deque[CommandRecord] = deque(maxlen=settings.episode_max_history)
        self.commands_run = 0
        self.calls: dict[str, CallStats] = {}
        self._call: asyncio.Task[object] | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._teardown_task: asyncio.Task[None] | None = None

    @property
    def sandbox(self) -> Sandbox | None:
        return self.workspace.sandbox

    @property
    def redact(self) -> Redactor:
        return self.workspace.redact

    # -- lifecycle -------------------------------------------------------------------------------------

    @staticmethod
    def check(task: Task, *, settings: Settings, backends: Backends) -> None:
        """`RequestError` if this server will not run `task` (its backend is not enabled, its limits are over
        the caps): what `start` would refuse before making anything."""
        backends.resolve(task.sandbox)
        resolve_limits(task, settings)

    @classmethod
    async def start(
        cls, task: Task, *, settings: Settings, backends: Backends, episode_id: str | None = None,
        on_end: Callable[[str], None] | None = None, caller: str | None = None,
    ) -> Episode:
        """Provision, write the files, run setup. The returned episode is running, or done (setup_failed,
        infra_error) with its sandbox gone. Cancelled meanwhile, it tears down and re-raises. `on_end` hears the
        status it ends with (an `EpisodeStatus` value), once. `caller`: who asks (a session's id), whose group
        templates are bounded together (`sandbox.templates`)."""
        episode = cls(task, settings=settings, backends=backends, episode_id=episode_id, on_end=on_end)
        episode.workspace.caller = caller
        await backends.check_usable(episode.backend)
        try:
            await episode._stage(episode.budget.provision_s, episode._provision())
            await episode._stage(episode.budget.setup_s, episode._setup())
        except TimeoutError:
            why = "provision or setup passed its deadline"
            await episode._end(EpisodeStatus.INFRA_ERROR, "start", "StageTimeout", why)
        except _INFRA_ERRORS as exc:
            await episode._end(EpisodeStatus.INFRA_ERROR, "start", type(exc).__name__, str(exc))
        except Exception as exc:  # noqa: BLE001 - typed in the report, and the sandbox torn down, never leaked
            log.exception("episode %s: unexpected error while starting", episode.id)
            await episode._end(EpisodeStatus.INFRA_ERROR, "start", type(exc).__name__, _message(exc))
        except asyncio.CancelledError:
            await episode._end(EpisodeStatus.CANCELLED, "start", "Cancelled", "the episode was cancelled")
            raise
        if episode.status is EpisodeStatus.RUNNING:
            episode._watchdog = asyncio.ensure_future(episode._watch())
        return episode

    @property
    def done(self) -> bool:
        return self.status is not EpisodeStatus.RUNNING

    @property
    def busy(self) -> bool:
        return self._call is not None and not self._call.done()

    async def close(self) -> None:
        """End the episode now (`cancelled` unless it had already ended): a call in flight is cancelled (its
        command's tree killed), then the sandbox is torn down. Idempotent."""
        call = self._call
        if call is not None and not call.done() and call is not asyncio.current_task():
            call.cancel()
            await asyncio.wait({call})
        await self._end(EpisodeStatus.CANCELLED, "episode", "Cancelled", "the episode was closed")

    # -- calls -----------------------------------------------------------------------------------------

    async def terminal(self, command: str) -> TerminalResult:
        """Run one command in the persistent shell. `EpisodeDoneError` if the episode has ended (also when
        its deadline passes during the command), `EpisodeBusyError` if a call is running."""
        return await self._exclusive(self._terminal(command), "terminal")

    async def keystrokes(self, keys: str, duration_s: float) -> TerminalResult:
        """Type `keys` into the live shell and return the output after `duration_s`; `KeystrokesUnsupportedError`
        where the episode's shell is one exec per command. Refused as `terminal` is when ended or busy."""
        if not isinstance(self.shell, LiveShell) and not self.done:
            raise KeystrokesUnsupportedError(self.sandbox.backend if self.sandbox else "?")
        return await self._exclusive(self._terminal(keys, duration_s=duration_s), "keystrokes")

    async def final_answer(self, answer: str) -> EpisodeReport:
        """End the agent's phase with `answer`, verify, score and tear down; the report (done, with the
        reward, or null when verify could not score it)."""
        return await self._exclusive(self._final_answer(answer), "final_answer")

    async def _terminal(self, command: str, *, duration_s: float | None = None) -> TerminalResult:
        """A command (or, with `duration_s`, keystrokes) in the shell, under the episode's deadline."""
        assert self.shell is not None, "a running episode has a shell"
        started = time.monotonic()
        try:
            async with asyncio.timeout_at(self.deadline):
                if duration_s is not None:
                    assert isinstance(self.shell, LiveShell)
                    outcome = await self.shell.keys(command, duration_s=duration_s)
                else:
                    outcome = await self.shell.run(command, timeout_s=self.task.command_timeout_s)
        except TimeoutError:
            await self._end(EpisodeStatus.EXPIRED, "terminal", "EpisodeTimeout", "the episode's deadline passed")
            raise EpisodeDoneError(self.id, self.status.value, "its deadline passed during the command") from None
        except _INFRA_ERRORS as exc:
            await self._end(EpisodeStatus.INFRA_ERROR, "terminal", type(exc).__name__, str(exc))
            raise EpisodeDoneError(self.id, self.status.value, "the sandbox failed") from None
        except Exception as exc:  # noqa: BLE001 - the episode ends typed, the caller gets the episode's error
            log.exception("episode %s: unexpected error in a command", self.id)
            await self._end(EpisodeStatus.INFRA_ERROR, "terminal", type(exc).__name__, _message(exc))
            raise EpisodeDoneError(self.id, self.status.value, f"unexpected {type(exc).__name__}") from None
        self.commands_run += 1
        shown = command if len(command) <= _SHOWN_COMMAND_CHARS else command[:_SHOWN_COMMAND_CHARS] + "..."
        self.history.append(CommandRecord(command=self.redact.text(shown), exit_code=outcome.exit_code,
                                          timed_out=outcome.timed_out))
        return TerminalResult(output=self.redact.text(outcome.output), exit_code=outcome.exit_code,
                              timed_out=outcome.timed_out, duration_s=round(time.monotonic() - started, 6),
                              note=getattr(outcome, "note", None))

    async def _final_answer(self, answer: str) -> EpisodeReport:
        answer_path = f"{self.workspace.open_sandbox().paths.logs}/final_answer.txt"
        try:
            await self._end_shell()  # its background jobs too: verify starts after every process the episode made
        except _INFRA_ERRORS as exc:
            await self._end(EpisodeStatus.INFRA_ERROR, "verify", type(exc).__name__, str(exc))
            return self.report()

        async def write_answer(target: Sandbox) -> None:
            await target.remove(answer_path)
            await target.write_text(answer_path, answer)

        verify = self.workspace.verify(env={"FINAL_ANSWER_FILE": answer_path}, prepare=write_answer)
        verification = self.workspace.verification
        try:
            await self._stage(self.budget.verify_s, verify)
        except CleanRoomSetupFailed as exc:
            await self._end(EpisodeStatus.SETUP_FAILED, "verify", "CleanRoomSetupFailed", exc.message)
        except TimeoutError:
            await self._end(EpisodeStatus.INFRA_ERROR, "verify", "StageTimeout", "the verify stage passed its deadline")
        except _INFRA_ERRORS as exc:
            await self._end(EpisodeStatus.INFRA_ERROR, "verify", type(exc).__name__, str(exc))
        except Exception as exc:  # noqa: BLE001 - on what the episode left: scored 0, never unscored
            log.exception("episode %s: unexpected error in verify", self.id)
            kind = type(exc).__name__
            verification.reward = 0.0
            verification.reward_note = f"verify could not complete on what the episode left ({kind}): scored 0"
            await self._end(EpisodeStatus.COMPLETED, "verify", kind, _message(exc))
        else:
            await self._end(EpisodeStatus.COMPLETED, "", "", "")
        return self.report()

    async def _exclusive(self, work: Awaitable[T], name: str) -> T:
        """`_run_exclusive`, counted in the report's `calls` under `name` (its time, and a failure if it raised)."""
        stats = self.calls.setdefault(name, CallStats())
        stats.count += 1
        started = time.monotonic()
        try:
            return await self._run_exclusive(work)
        except BaseException:
            stats.failures += 1
            raise
        finally:
            stats.seconds = round(stats.seconds + time.monotonic() - started, 6)

    async def _run_exclusive(self, work: Awaitable[T]) -> T:
        """Run one call: refused when ended or busy; cancelling the caller cancels it (and waits for it)."""
        if self.done:
            _close_unawaited(work)
            raise EpisodeDoneError(self.id, self.status.value, self.error.message if self.error else None)
        if self.busy:
            _close_unawaited(work)
            raise EpisodeBusyError(self.id)
        self.touch()
        self.step_count += 1
        task = asyncio.ensure_future(work)
        self._call = task  # type: ignore[assignment]
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            caller = asyncio.current_task()
            if caller is None or caller.cancelling():  # our caller is cancelled: so is the call
                task.cancel()
                await asyncio.wait({task})
                raise
            # Only the call was: close() ended the episode under it.
            raise EpisodeDoneError(self.id, EpisodeStatus.CANCELLED.value, "it was closed during the call") from None
        finally:
            self.touch()

    # -- stages ----------------------------------------------------------------------------------------

    async def _stage(self, budget_s: float, work: Awaitable[None]) -> None:
        """`work` under its own budget and the episode's deadline, whichever comes first."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout_at(min(loop.time() + budget_s, self.deadline)):
            await work

    async def _provision(self) -> None:
        spec = SandboxSpec(
            rollout_id=f"episode-{uuid.uuid4().hex}", image=self.task.image, network="none", limits=self.limits,
            env=self.task.env,
            deadline_s=self.settings.episode_timeout_s + self.settings.teardown_timeout_s,
        )
        sandbox = await self.workspace.provision(spec)
        shell_dir = f"{sandbox.paths.logs}/agent"
        await sandbox.mkdir(shell_dir)
        self._shell_dir = shell_dir
        self.shell = SandboxShell(sandbox, shell_dir, max_output_bytes=self.settings.episode_max_output_bytes,
                                  user=self.task.agent_user)
        self.shell_kind = "per_command"

    async def _setup(self) -> None:
        failure = await self.workspace.set_up()
        if failure is not None:
            await self._end(EpisodeStatus.SETUP_FAILED, "setup", "SetupCommandFailed", failure.message)
            return
        await self._start_shell()

    async def _start_shell(self) -> None:
        """The live shell, after setup (so nothing of setup runs in it). Where it cannot start (no `python3` in the
        sandbox, a backend that cannot attach to a process, an agent user that could unseal it: docs/live-shell.md),
        one exec per command: the report's `shell` says so."""
        sandbox = self.workspace.open_sandbox()
        live = LiveShell(sandbox, self._shell_dir, max_output_bytes=self.settings.episode_max_output_bytes,
                         user=self.task.agent_user)
        try:
            await live.start()
        except (LiveShellError, SandboxUnsupportedError) as exc:
            log.warning("episode %s: no live shell (%s); one exec per command", self.id, exc)
            return
        self.shell, self.shell_kind = live, "live"

    async def _end_shell(self) -> None:
        if isinstance(self.shell, LiveShell):
            await self.shell.close()

    # -- ending ----------------------------------------------------------------------------------------

    def touch(self) -> None:
        self.last_active = asyncio.get_running_loop().time()

    async def _watch(self) -> None:
        """End the episode at its deadline, or once idle too long (never during a call: the deadline bounds
        calls themselves)."""
        loop = asyncio.get_running_loop()
        idle_s = self.settings.episode_idle_timeout_s
        while not self.done:
            call = self._call
            if call is not None and not call.done():
                await asyncio.wait({call})
                continue
            wake = min(self.deadline, self.last_active + idle_s)
            if loop.time() >= wake:
                why = "deadline" if loop.time() >= self.deadline else f"idle timeout ({idle_s:g}s)"
                await self._end(EpisodeStatus.EXPIRED, "episode", "EpisodeExpired", f"the episode's {why} passed")
                return
            await asyncio.sleep(wake - loop.time())

    async def _end(self, status: EpisodeStatus, stage: str, kind: str, message: str) -> None:
        """Record how the episode ended (the first end wins) and tear it down, shielded, once."""
        if not self.done:
            self.status = status
            if kind:
                self.error = ErrorInfo(type=kind, stage=stage, message=self.redact.text(message))
            if status is not EpisodeStatus.COMPLETED:
                self.workspace.verification.reward = None
            log.info("episode %s ended: %s", self.id, status.value)
            if self._on_end is not None:
                try:
                    self._on_end(status.value)
                except Exception:  # noqa: BLE001 - a listener never changes how the episode ends
                    log.exception("episode %s: its end listener failed", self.id)
        if self._teardown_task is None:
            self._teardown_task = asyncio.ensure_future(self._teardown())
        await shielded(self._teardown_task)

    async def _teardown(self) -> None:
        watchdog = self._watchdog
        if watchdog is not None and watchdog is not asyncio.current_task():
            watchdog.cancel()
        try:
            await self._end_shell()
        except Exception:  # noqa: BLE001 - closing the sandbox below ends whatever the shell left
            log.exception("episode %s: closing the live shell failed", self.id)
        failure = await self.workspace.close()
        if failure is not None and self.error is None:
            self.error = failure

    # -- report ----------------------------------------------------------------------------------------

    def report(self) -> EpisodeReport:
        sandbox, verification = self.sandbox, self.workspace.verification
        return EpisodeReport(
            **self.workspace.report_fields(),
            episode_id=self.id, task_id=self.task.task_id, shell=self.shell_kind, status=self.status, done=self.done,
            step_count=self.step_count, sandbox_id=sandbox.id if sandbox else None,
            reward=verification.reward if self.status is EpisodeStatus.COMPLETED else None,
            reward_note=verification.reward_note,
            commands=list(self.history), commands_dropped=self.commands_run - len(self.history), error=self.error,
            calls={name: stats.model_copy() for name, stats in self.calls.items()},
        )


def _message(exc: Exception) -> str:
    return str(exc) or type(exc).__name__


def _close_unawaited(work: Awaitable[object]) -> None:
    close: Callable[[], None] | None = getattr(work, "close", None)
    if close is not None:
        close()
