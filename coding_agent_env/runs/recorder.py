"""The server's side of the results store: every rollout a session finishes, kept (`RESULTS_FROM_SERVER`)."""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

from coding_agent_env.models import RolloutResult
from coding_agent_env.runs.journal import Record
from coding_agent_env.runs.store import ResultsStore
from coding_agent_env.settings import Settings

__all__ = ["ServerRecorder"]

log = logging.getLogger(__name__)


class ServerRecorder:
    """A `SessionManager.on_result`: hands each result to one writer thread (the event loop never waits on the
    disk), which opens the store at the first result (nothing at import or start-up) under one run per server
    process, origin `server`. `aclose` waits for what was handed over, then closes the store."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._store: ResultsStore | None = None
        self._run_id = ""
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="results-writer")

    def __call__(self, result: RolloutResult) -> None:
        self._writer.submit(self._write, result)

    def _write(self, result: RolloutResult) -> None:
        try:
            if self._store is None:
                self._store = ResultsStore.from_settings(self.settings)
                self._run_id = self._store.new_run("server", "rollouts served")
            self._store.add(self._run_id, Record(result.task_id or "", 1, result))
        except Exception:  # a full disk or a locked file must not end the server's rollouts
            log.exception("results store: rollout %s not kept", result.rollout_id)

    async def aclose(self) -> None:
        await asyncio.to_thread(self._writer.shutdown, wait=True)
        if self._store is not None:
            self._store.close()
            self._store = None
