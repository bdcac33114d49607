"""The server's side of the results store: every rollout a session finishes, kept (`RESULTS_FROM_SERVER`).

Nothing is lost silently: a result the store does not acknowledge (refused, or the store unreachable) is logged
as one line naming its rollout and why, and appended to `STATE_DIR/results-unstored.jsonl` (the batch journal's
line shape, `coding-agent-env run`'s `--out` format), from which it can be re-added."""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

from coding_agent_env.models import RolloutResult
from coding_agent_env.runs.journal import Record, append_record
from coding_agent_env.runs.store import ResultsStore
from coding_agent_env.runs.store_errors import ResultsStoreError
from coding_agent_env.settings import Settings

__all__ = ["UNSTORED_FILE", "ServerRecorder"]

log = logging.getLogger(__name__)

UNSTORED_FILE = "results-unstored.jsonl"
"""Under STATE_DIR: the results the store did not acknowledge, one JSONL line each."""


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
        record = Record(result.task_id or "", 1, result)
        try:
            if self._store is None:
                self._open()
            assert self._store is not None
            self._store.add(self._run_id, record)
            return
        except ResultsStoreError as exc:  # a full disk or a refused row must not end the server's rollouts
            reason = " ".join(str(exc).split())
        except Exception as exc:  # noqa: BLE001 - not the store's own refusal (a bug): still this row's loss
            log.exception("results store: rollout %s raised", result.rollout_id)
            reason = f"{type(exc).__name__}: {exc}"
        self._spill(record, reason)

    def _open(self) -> None:
        """The store, with this server's run in it; kept only once both are (a store that refused the run is
        closed and opened anew for the next result: no row is ever added under no run)."""
        store = ResultsStore.from_settings(self.settings)
        try:
            self._run_id = store.new_run("server", "rollouts served")
        except BaseException:
            store.close()
            raise
        self._store = store

    def _spill(self, record: Record, reason: str) -> None:
        """Keep a result the store did not take in `UNSTORED_FILE`, and say so (one line)."""
        path = self.settings.state_dir / UNSTORED_FILE
        try:
            append_record(path, record)
        except OSError as exc:
            log.error("results store: rollout %s LOST: not stored (%s) and not written to %s (%s)",
                      record.result.rollout_id, reason, path, exc)
            return
        log.warning("results store: rollout %s not stored (%s); kept in %s", record.result.rollout_id, reason, path)

    async def aclose(self) -> None:
        await asyncio.to_thread(self._writer.shutdown, wait=True)
        if self._store is not None:
            self._store.close()
            self._store = None
