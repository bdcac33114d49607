"""The server's side of the results store: every rollout a session finishes, kept (`RESULTS_FROM_SERVER`)."""

from __future__ import annotations

from coding_agent_env.models import RolloutResult
from coding_agent_env.runs.journal import Record
from coding_agent_env.runs.store import ResultsStore
from coding_agent_env.settings import Settings

__all__ = ["ServerRecorder"]


class ServerRecorder:
    """A `SessionManager.on_result`: opens the store at the first result (nothing at import or start-up) under one
    run per server process, origin `server`."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._store: ResultsStore | None = None
        self._run_id = ""

    def __call__(self, result: RolloutResult) -> None:
        if self._store is None:
            self._store = ResultsStore.from_settings(self.settings)
            self._run_id = self._store.new_run("server", "rollouts served")
        self._store.add(self._run_id, Record(result.task_id or "", 1, result))

    async def aclose(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None
