"""`CodingEnvironment`: this server's interactive episodes as TRL's `GRPOTrainer(environment_factory=...)` wants an
environment: a class whose public methods are the model's tools.

    from functools import partial
    from coding_agent_env.harness import CodingEnvironment

    trainer = GRPOTrainer(model=..., train_dataset=tasks, args=GRPOConfig(...),
                          environment_factory=partial(CodingEnvironment, "http://127.0.0.1:8000"))

TRL's contract (trl 1.16, `trl/trainer/grpo_trainer.py`, and the experimental `AsyncGRPOTrainer`'s worker):
- the factory is called once at the trainer's start (a probe, kept in the pool) and then whenever a batch needs
  more concurrent instances than the pool holds; instances are reused for many rollouts, one rollout at a time;
- `reset(**row)` is called (synchronously, also by the async trainer) with the whole dataset row before each
  rollout; the text it returns is appended to the row's last prompt message (no separator is added);
- every public function of the class other than `reset` and `get_reward` is a tool: TRL renders its JSON schema
  from its signature and its docstring's `Args:` section (transformers' `get_json_schema`), calls it with the
  model's arguments and gives the model `str()` of what it returns (an exception becomes `{'error': ...}`);
- `get_reward()` (sync or async) is called once after each rollout; its float is a reward column named after
  the class, with weight 1.

So the only tool here is `terminal`; `close` is deliberately not a function of the class (TRL would offer it to
the model). What a rollout does on the server: `reset` starts an episode in the instance's one server session
(a second `reset` ends the previous episode, as the server does for any session), `terminal` runs one command in
its persistent shell, and `get_reward` gives the final answer, which verifies the task exactly as a rollout is
verified, and returns the reward.

Failures: whatever the server says (a task it refuses, an episode that ended or expired, a command or a reply
that timed out, capacity) is text the model reads (from `reset` and `terminal`) or an unscored reward (from
`get_reward`), never an exception: a trainer is not stopped by one bad task. A server that cannot be reached is
`ServerUnreachableError` from every method: training on an absent environment must stop.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Self, TypeVar

from coding_agent_env.harness.episodes import EpisodeSession, EpisodeSessionFactory
from coding_agent_env.harness.channel import (
    Channel,
    ConnectionLostError,
    HarnessError,
    ServerRefusedError,
)
from coding_agent_env.models import Task

__all__ = ["AGENT_RUN_FIELDS", "ROW_KEYS", "AsyncCodingEnvironment", "CodingEnvironment"]

logger = logging.getLogger(__name__)
T = TypeVar("T")

AGENT_RUN_FIELDS = frozenset({"solution", "solution_files", "solution_env", "agent_timeout_s", "steps", "step_reward"})
"""Task fields only an agent run uses, which an episode refuses (the server's `episode.task.AGENT_RUN_FIELDS`; a
test keeps the two equal). A dataset may carry them (an oracle's solution, say): they stay out of `reset`."""
UPSTREAM_ALIASES = frozenset({"setup_scripts", "verify_scripts", "sandbox_backend"})
"""Upstream `terminus_env`'s names for setup, verify and sandbox, which the server takes too."""
TASK_KEYS = frozenset(Task.model_fields) - AGENT_RUN_FIELDS | UPSTREAM_ALIASES
"""The columns that make a task: any one of them in a row (or the defaults) starts an episode."""
SET_KEYS = frozenset({"split", "index"})
"""Columns naming a task of the server's task set (`serve --tasks`): `split` with `index`, or with `seed` for a
group (every member passing the same seed gets the same task); a `task_id` column alone names one too."""
ROW_KEYS = TASK_KEYS | SET_KEYS | {"seed", "episode_id"}
"""The row's columns `reset` sends; every other column (`prompt`, TRL's own, the dataset's) is ignored."""


def _row_group(arguments: dict[str, Any]) -> dict[str, Any]:
    """`arguments` in the group of every row giving the same task, when it gives a task with setup and no group."""
    if "group_id" in arguments or not (arguments.get("setup") or arguments.get("setup_scripts")):
        return arguments
    task = {key: value for key, value in arguments.items() if key in TASK_KEYS}
    digest = hashlib.sha256(json.dumps(task, sort_keys=True, default=str).encode()).hexdigest()[:24]
    return {**arguments, "group_id": f"row-{digest}"}


class _NotATool:
    """A method TRL must not offer the model: TRL 1.16 takes every public *function of the class*
    (`inspect.getmembers(type(env), inspect.isfunction)`), older ones every public *bound method of the instance*
    (`inspect.getmembers(env, inspect.ismethod)`); this descriptor is neither, yet `env.close()` works."""

    def __init__(self, func: Callable[..., Any]) -> None:
        self._func = func
        self.__doc__ = func.__doc__
        self.__name__ = func.__name__

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        if instance is None:
            return self
        return functools.partial(self._func, instance)


class _Link:
    """The instance's connection (one server session, reopened when it dropped) and, for the async variant, the
    thread its calls run on. Holds no reference to the environment, so a finaliser can close it."""

    def __init__(self, factory: EpisodeSessionFactory) -> None:
        self.factory = factory
        self.channel: Channel | None = None
        self.executor: ThreadPoolExecutor | None = None

    def open(self) -> Channel:
        """The open channel, connecting anew if there is none or it was closed (`ServerUnreachableError`)."""
        if self.channel is None or self.channel.closed:
            self.channel = None
            self.channel = self.factory.connect()
        return self.channel

    def close(self) -> None:
        channel, self.channel = self.channel, None
        executor, self.executor = self.executor, None
        try:
            if channel is not None:
                channel.close()
        except Exception:  # best effort (also at interpreter exit)
            logger.debug("closing a CodingEnvironment's connection failed", exc_info=True)
        if executor is not None:
            executor.shutdown(wait=False)


class _Environment:
    """What both variants share: the episode's life over the instance's connection. See the module docstring."""

    def __init__(
        self,
        base_url: str | Sequence[str],
        *,
        message_timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        final_answer: str = "done",
        unscored_reward: float | None = 0.0,
        group_rows: bool = True,
        **task_defaults: Any,
    ) -> None:
        """`base_url`: the server (`http://host:port`), or several (a list, or comma-separated): each connection
        opens on the server with the fewest of this process's sessions and its episodes stay there.
        `task_defaults`: task fields every row gets unless it gives
        its own (`sandbox="local"`, `command_timeout_s=30`, or a whole task for a dataset of bare prompts).
        `message_timeout_s` bounds each exchange with the server (above the longest setup, command and verify);
        `final_answer` is what `get_reward` answers with (verify reads it at `$FINAL_ANSWER_FILE`);
        `unscored_reward` is `get_reward`'s value for an episode that was never scored (None: TRL 1.16 then leaves
        the rollout out of its group's baseline and gives it no advantage). `group_rows`: a row that gives a task
        with setup commands and no `group_id` is in the group of every row with the same task (TRL repeats a row
        for each member of its GRPO group): their setup runs once and each member's sandbox is forked from it
        (see `Task.group_id`); False: every episode sets up on its own. Connects on the first `reset`, not here:
        TRL makes a probe instance before training starts."""
        self._link = _Link(EpisodeSessionFactory(base_url, defaults=_clean(task_defaults),
                                                 message_timeout_s=message_timeout_s,
                                                 connect_timeout_s=connect_timeout_s))
        self._finalizer = weakref.finalize(self, _Link.close, self._link)  # on collection, and at exit
        self._final_answer = final_answer
        self._group_rows = group_rows
        self._unscored_reward = None if unscored_reward is None else float(unscored_reward)
        self._episode: EpisodeSession | None = None
        self._no_episode = "call reset first"
        self._scored: tuple[float | None] | None = None  # (get_reward's value,) once given
        self.report: dict[str, Any] | None = None
        """The last episode's report (status, setup and verify results, reward, ...); None before a reset."""
        self.reward: float | None = None
        """The last episode's verified reward as the server gave it: None until it was scored, or if it never was
        (then `get_reward` returned `unscored_reward`)."""

    @property
    def base_url(self) -> str:
        """The server(s) given, comma-separated."""
        return self._link.factory.base_url

    @property
    def server(self) -> str | None:
        """The server this instance's connection is open to; None while it has none."""
        channel = self._link.channel
        return None if channel is None or channel.closed else channel.base_url

    def reset(self, **row: Any) -> str:
        """Start an episode of the row's task (ending this instance's previous one) and return its instruction,
        then how setup went. The task is the row's task columns over the instance's defaults: `Task`'s fields
        (`instruction`, `files`, `setup`, `verify`, `sandbox`, `limits`, ...; not the agent-run ones such as
        `solution`), upstream `terminus_env`'s `setup_scripts` / `verify_scripts` / `sandbox_backend`, and `seed` /
        `episode_id`; or a task of the server's task set: `split` and `index` (or `seed`, the same task for a
        whole group), or `task_id` alone (the defaults' task fields are then left out; the row's own are refused
        by the server). Every other column (`prompt`, ...) is ignored, and so is a column whose value is None (a
        Hugging Face dataset fills a missing column, or a missing key of a mapping column, with None).

        A task the server refuses (invalid fields, capacity, a sandbox backend it lacks) or a setup that fails is
        the returned text (the model reads it; its `terminal` calls say there is no episode and `get_reward`
        gives the unscored reward), logged as a warning. `ServerUnreachableError` when the server cannot be
        reached."""
        self._episode, self._scored, self.report, self.reward = None, None, None, None
        given = _clean({k: v for k, v in row.items() if k in ROW_KEYS})
        arguments = {**self._link.factory.defaults, **given}
        if SET_KEYS & arguments.keys():  # a task of the set runs as the set holds it: no task fields beside it
            arguments = {k: v for k, v in arguments.items() if k in SET_KEYS | {"seed", "episode_id"}
                         or (k in given and k in TASK_KEYS)}
        if self._group_rows and not SET_KEYS & arguments.keys():
            arguments = _row_group(arguments)
        if not (TASK_KEYS | SET_KEYS) & arguments.keys():
            self._no_episode = "the row names no task (no instruction, files, setup or verify column)"
            self._ask_bare_reset()  # ends the previous episode; the session stays
            logger.warning("CodingEnvironment.reset: %s; row columns: %s", self._no_episode, sorted(row)[:20])
            return f"No task: {self._no_episode}."
        try:
            self._episode = self._start(arguments)
        except ServerRefusedError as exc:
            self._no_episode = f"the episode could not start: {exc}"
            logger.warning("CodingEnvironment.reset: %s", self._no_episode)
            self._ask_bare_reset()  # a refused start leaves the previous episode running: end it
            return f"The episode could not start: {exc}"
        except ConnectionLostError as exc:
            self._no_episode = f"the episode could not start: {_lost(exc)}"
            logger.warning("CodingEnvironment.reset: %s", self._no_episode)
            return f"The episode could not start: {_lost(exc)}"
        self.report = dict(self._episode.episode)
        if self._episode.done:
            self._no_episode = f"the episode ended at setup ({self.report.get('status')})"
            logger.warning("CodingEnvironment.reset: %s", self._no_episode)
        return self._episode.instruction

    def _start(self, arguments: dict[str, Any]) -> EpisodeSession:
        """The episode on the instance's connection; a connection that dropped since (an idle proxy, a server
        restart) is reopened once and the reset sent again."""
        channel = self._link.open()
        try:
            return EpisodeSession(self._link.factory, arguments, channel=channel)
        except ConnectionLostError as exc:
            if exc.timed_out:
                raise
        return EpisodeSession(self._link.factory, arguments, channel=self._link.open())

    def _ask_bare_reset(self) -> None:
        channel = self._link.channel
        if channel is None or channel.closed:
            return  # no session, so no episode left to end
        try:
            channel.ask({"type": "reset", "data": {}}, "observation")
        except HarnessError as exc:
            logger.debug("ending the previous episode: %s", exc)

    def _terminal(self, command: Any) -> str:
        episode = self._episode
        if episode is None:
            return f"Error: no episode is running ({self._no_episode})."
        if self._scored is not None:
            return "Error: the episode has ended (its final answer was given); no command runs."
        try:
            result = episode.call_tool("terminal", {"command": command})
        except ServerRefusedError as exc:
            return f"Error: {exc}"
        except ConnectionLostError as exc:
            self._check_alive()
            return f"Error: {_lost(exc)}; the episode has ended."
        except HarnessError as exc:  # the connection was closed before: the episode is gone
            self._check_alive()
            return f"Error: the episode has ended ({exc})."
        if result.done:
            self._record(result.metadata.get("reward"), result.metadata.get("result"))
        text = str(result.data)
        return f"Error: {text}" if result.error and not text.startswith("Error") else text

    def _get_reward(self) -> float | None:
        if self._scored is not None:
            return self._scored[0]
        episode = self._episode
        if episode is None:
            logger.info("CodingEnvironment.get_reward: unscored: %s", self._no_episode)
            return self._record(None, None)
        if episode.done:  # ended at setup
            return self._record(episode.reward, episode.episode)
        try:
            result = episode.call_tool("terminal", {"final_answer": self._final_answer})
        except ServerRefusedError as exc:
            logger.warning("CodingEnvironment.get_reward: unscored: %s", exc)
            return self._record(None, None)
        except HarnessError as exc:
            self._check_alive()
            logger.warning("CodingEnvironment.get_reward: unscored: %s", exc)
            return self._record(None, None)
        if result.error:  # expired, or ended some other way meanwhile
            logger.info("CodingEnvironment.get_reward: unscored: %s", result.data)
            return self._record(None, None)
        return self._record(result.metadata.get("reward"), result.metadata.get("result"))

    def _record(self, reward: Any, report: Any) -> float | None:
        self.reward = float(reward) if isinstance(reward, int | float) and not isinstance(reward, bool) else None
        if isinstance(report, Mapping):
            self.report = dict(report)
        self._scored = (self._unscored_reward if self.reward is None else self.reward,)
        return self._scored[0]

    def _check_alive(self) -> None:
        """After a lost connection: reconnect (for the next reset), so a dead server is `ServerUnreachableError`
        now rather than a text the trainer would train on."""
        self._link.open()

    def _close(self) -> None:
        """End the episode and close the instance's server session (also done when the instance is collected, and at
        interpreter exit). A later `reset` connects again. Idempotent."""
        self._episode = None
        self._no_episode = "the environment was closed"
        self._link.close()

    close = _NotATool(_close)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self._close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_url!r})"


class CodingEnvironment(_Environment):
    """An environment for TRL's `GRPOTrainer(environment_factory=...)`: each rollout one interactive episode on a
    coding-agent-env server, the model acting through the `terminal` tool, the reward verified by the server.

    `CodingEnvironment(base_url, **task_defaults)`; keyword options `message_timeout_s` (600), `connect_timeout_s`
    (10), `final_answer` ("done"), `unscored_reward` (0.0). `reset(**row)` starts the row's task and returns its
    instruction; `terminal(command)` is the tool; `get_reward()` ends the episode with the final answer and
    returns the verified reward. `close()` (or `with`) ends the server session; collection and interpreter exit
    do too. After `get_reward`, `report` and `reward` hold the episode's report and its reward as scored (None
    when it never was). See the module docstring for what becomes text and what raises.

    The docstring of `terminal` is the model's: transformers' `get_json_schema` makes the tool's schema of it (its
    first paragraph the description, kept on one line: line breaks would reach the model)."""

    def terminal(self, command: str) -> str:
        """Run one shell command in the task's sandbox: a persistent shell, where cd and export carry over.

        Args:
            command: The shell command to run, for example `ls -la` or `python3 -m pytest -q`.

        Returns:
            Its output (stdout and stderr; a long one cut in the middle), then its exit code or a timeout note.
        """
        return self._terminal(command)

    def get_reward(self) -> float | None:
        """End the episode with the final answer (`final_answer`), have the server verify it (as a rollout is
        verified: a fresh context, hidden verify files, the task's reward rule) and return the reward. An episode
        that was never scored (no task, a task the server refused, a setup that failed, an infra error, an expired
        or lost episode) gives `unscored_reward`: 0.0 by default, a failure like any other (None to have TRL
        leave the rollout out), and `reward` stays None. Asked again before the next reset: the same value.
        `ServerUnreachableError` when the server cannot be reached."""
        return self._get_reward()


class AsyncCodingEnvironment(_Environment):
    """`CodingEnvironment` with `async` `terminal` and `get_reward` (TRL awaits async tools and an async
    `get_reward` on its event loop). Each call's exchange with the server runs on a thread of the instance's own,
    so the loop never blocks and instances proceed side by side. `reset` stays synchronous: TRL calls it so in
    both of its GRPO trainers."""

    async def terminal(self, command: str) -> str:
        """Run one shell command in the task's sandbox: a persistent shell, where cd and export carry over.

        Args:
            command: The shell command to run, for example `ls -la` or `python3 -m pytest -q`.

        Returns:
            Its output (stdout and stderr; a long one cut in the middle), then its exit code or a timeout note.
        """
        return await self._in_thread(self._terminal, command)

    async def get_reward(self) -> float | None:
        """`CodingEnvironment.get_reward`, awaited."""
        return await self._in_thread(self._get_reward)

    async def _in_thread(self, func: Callable[..., T], *args: Any) -> T:
        if self._link.executor is None:
            self._link.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="coding-environment")
        return await asyncio.get_running_loop().run_in_executor(self._link.executor, func, *args)


def _clean(values: Mapping[str, Any]) -> dict[str, Any]:
    """None counts as absent: at the top, and as a mapping's value (Arrow stores a column of mappings as a
    struct of every key any row has, the others None)."""
    return {
        key: {k: v for k, v in value.items() if v is not None} if isinstance(value, Mapping) else value
        for key, value in values.items()
        if value is not None
    }


def _lost(exc: ConnectionLostError) -> str:
    if exc.timed_out:
        return "the server did not answer in time"
    return "the connection to the server was lost"

