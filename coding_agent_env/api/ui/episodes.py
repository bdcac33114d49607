"""Interactive episodes started from the web tab: one UI session per episode, a transcript, cancel.

Contract:
- `start(owner, task)` ends the owner's episode if any, takes a `SessionKind.UI` slot from the shared session
  manager (`CapacityError` when full, like every other session) and starts the episode in it. An episode that
  ends (its setup failed, its final answer, its deadline or idle timeout) gives its slot back at the owner's
  next action, or the idle reaper frees it; `cancel(owner)` closes the session at once (the sandbox is torn
  down before it returns). `owner` is the browser session; one episode per owner.
- `run(owner, command)` and `answer(owner, text)` are `terminal` calls in that episode, their arguments validated
  by the tool's own `validate` (`EpisodeError`s as the Gym API raises them: no episode, bad arguments, busy,
  ended); each adds to the owner's transcript (command,
  exit code, output; bounded to the latest `MAX_TRANSCRIPT_CHARS`).
- `stop()` (server shutdown) closes every UI episode.

Everything runs on the server's event loop (Gradio runs async handlers there).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from coding_agent_env.api.tools import START_EPISODE, TERMINAL
from coding_agent_env.api.tools.terminal import command_text
from coding_agent_env.episode import Episode, EpisodeDoneError, EpisodeReport, TerminalResult
from coding_agent_env.session import NoEpisodeError, Session, SessionKind, SessionManager

__all__ = ["MAX_TRANSCRIPT_CHARS", "UiEpisode", "UiEpisodes"]

MAX_TRANSCRIPT_CHARS = 200_000


@dataclass
class UiEpisode:
    """One owner's episode as the tab shows it."""

    session: Session
    episode: Episode | None = None
    """Kept once started: its report stays on the tab after the session (and its slot) is gone."""
    transcript: list[str] = field(default_factory=list)

    def add(self, entry: str) -> None:
        self.transcript.append(entry)
        while len(self.transcript) > 1 and sum(len(e) for e in self.transcript) > MAX_TRANSCRIPT_CHARS:
            del self.transcript[0]

    def text(self) -> str:
        return "\n".join(self.transcript)

    def report(self) -> EpisodeReport | None:
        return self.episode.report() if self.episode is not None else None


class UiEpisodes:
    """The web tab's episodes, keyed by browser session."""

    def __init__(self, manager: SessionManager) -> None:
        self._manager = manager
        self._episodes: dict[str, UiEpisode] = {}

    def get(self, owner: str) -> UiEpisode | None:
        return self._episodes.get(owner)

    async def start(self, owner: str, task: dict[str, Any]) -> UiEpisode:
        await self.cancel(owner)
        session = self._manager.create(SessionKind.UI)
        view = UiEpisode(session)
        self._episodes[owner] = view
        try:
            view.episode = await session.start_episode(START_EPISODE.validate(task))
        except BaseException:
            await self.cancel(owner)
            raise
        report = view.episode.report()
        for result in report.setup_results:
            view.add(f"[setup] $ {result.cmd}\n{result.stdout}{result.stderr}[exit code {result.exit_code}]")
        view.add(f"[episode {report.status.value}: sandbox {report.sandbox} ({report.isolation})]")
        await self._release_if_done(view)
        return view

    async def run(self, owner: str, command: str) -> TerminalResult:
        outcome = await self._terminal(owner, {"command": command})
        assert isinstance(outcome, TerminalResult)
        return outcome

    async def answer(self, owner: str, text: str) -> EpisodeReport:
        outcome = await self._terminal(owner, {"final_answer": text})
        assert isinstance(outcome, EpisodeReport)
        return outcome

    async def _terminal(self, owner: str, arguments: dict[str, str]) -> TerminalResult | EpisodeReport:
        """One `terminal` call in the owner's episode, its arguments validated by the tool; its transcript entry."""
        view = self._view(owner)
        outcome = await view.session.terminal(TERMINAL.validate(arguments))
        view.add(_entry(arguments, outcome))
        await self._release_if_done(view)
        return outcome

    async def cancel(self, owner: str) -> bool:
        """Close the owner's episode and free its slot; False if it had none."""
        view = self._episodes.pop(owner, None)
        if view is None:
            return False
        await self._manager.close(view.session.id)
        return True

    async def stop(self) -> None:
        for owner in list(self._episodes):
            await self.cancel(owner)

    def _view(self, owner: str) -> UiEpisode:
        """The owner's running episode; `NoEpisodeError`, or `EpisodeDoneError` once it ended."""
        view = self._episodes.get(owner)
        if view is None or view.episode is None:
            raise NoEpisodeError()
        if view.episode.done:
            report = view.episode.report()
            why = report.error.message if report.error is not None else None
            raise EpisodeDoneError(report.episode_id, report.status.value, why)
        return view

    async def _release_if_done(self, view: UiEpisode) -> None:
        """An ended episode keeps its transcript and report for the tab, not its slot."""
        if view.episode is not None and view.episode.done:
            await self._manager.close(view.session.id)


def _entry(arguments: dict[str, str], outcome: TerminalResult | EpisodeReport) -> str:
    """The transcript's entry for a call: the command and how it ended, or the final answer's verdict."""
    if isinstance(outcome, TerminalResult):
        return f"$ {arguments['command']}\n{command_text(outcome)}"
    reward = "null" if outcome.reward is None else f"{outcome.reward:g}"
    return f"[final answer submitted; episode {outcome.status.value}, reward {reward}]"
