"""`start_episode`: start an interactive episode in the caller's session (ending its previous one).

An MCP tool only: on OpenEnv's paths a `reset` with task arguments does the same (`protocols.step.reset`, which
calls `StartEpisode.start` with its `episode_id`). The arguments are `reset`'s task fields, validated by
`episode.parse_task`; the reply is the episode's opening observation: the instruction, the episode's report
(setup results, status, sandbox), the tools it now offers and its opening as one text; `done` when setup
already ended it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from coding_agent_env.api.tools.base import Tool
from coding_agent_env.api.tools.reply import ToolReply
from coding_agent_env.episode import Episode, EpisodeReport, parse_task
from coding_agent_env.episode.task import task_schema
from coding_agent_env.models import RolloutRequest
from coding_agent_env.session import Session

__all__ = ["START_EPISODE_DESCRIPTION", "StartEpisode", "start_text"]

START_EPISODE_DESCRIPTION = (
    "Start an interactive episode in this MCP session (ending its previous one): a fresh sandbox with the task's "
    "files, set up by its setup commands. Then call `terminal` with one command at a time, and finally with "
    "`final_answer`, which verifies and scores the episode."
)


class StartEpisode(Tool[RolloutRequest]):
    name = "start_episode"
    description = START_EPISODE_DESCRIPTION
    openenv = False

    def __init__(self, listing: Callable[[bool], list[dict[str, Any]]]) -> None:
        """`listing(live_episode)`: the step path's tool descriptors (the table's), shown in the observation."""
        self._listing = listing

    def schema(self) -> dict[str, Any]:
        return _task_schema()

    def validate(self, arguments: Any) -> RolloutRequest:
        return parse_task(arguments)

    async def run(self, session: Session, arguments: RolloutRequest) -> ToolReply:
        return await self.start(session, arguments)

    async def start(self, session: Session, task: RolloutRequest, episode_id: str | None = None) -> ToolReply:
        """Start the episode of a validated task; the reply's `data` is its opening observation."""
        episode = await session.start_episode(task, episode_id)
        report = episode.report()
        observation = self.observation(episode, report)
        return ToolReply(observation["text"], observation, done=report.done)

    def observation(self, episode: Episode, report: EpisodeReport) -> dict[str, Any]:
        return {
            "instruction": episode.task.instruction,
            "episode": report.model_dump(mode="json"),
            "tools": self._listing(not report.done),
            "text": start_text(episode.task.instruction, report),
        }


def start_text(instruction: str, report: EpisodeReport) -> str:
    """The episode's opening as one text: the instruction, then how setup went."""
    ran = len(report.setup_results)
    if report.status.value == "running":
        setup = f"Setup: {ran} command(s) passed." if ran else "Setup: none."
    else:
        why = report.error.message if report.error is not None else report.status.value
        setup = f"The episode could not start ({report.status.value}): {why}."
    return f"{instruction}\n\n{setup}"


@functools.cache
def _task_schema() -> dict[str, Any]:
    return task_schema()
