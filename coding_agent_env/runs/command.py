"""`coding-agent-env run TASKS...`: a batch from the command line.

Exit codes: 0 when the batch ran (whatever the rewards), 2 for bad usage, 130 when interrupted (what finished is
in `--out`; rerun the same command to go on).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from rich.console import Console

from coding_agent_env.errors import InvalidTaskError
from coding_agent_env.models import AGENT_NAMES
from coding_agent_env.runs.batch import BatchPlan, RecordSink, run_batch
from coding_agent_env.runs.executor import Executor, InProcessExecutor, ServerExecutor
from coding_agent_env.runs.journal import Journal, Record
from coding_agent_env.runs.progress import LiveProgress, summary_table
from coding_agent_env.runs.store import ResultsStore
from coding_agent_env.sandbox.base import SandboxLimits
from coding_agent_env.settings import Settings
from coding_agent_env.tasks import TaskOptions, count_tasks, iter_tasks

__all__ = ["add_arguments", "run"]

EXIT_INTERRUPTED = 130


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("tasks", nargs="+", help="request files (JSON/YAML), JSONL datasets, Harbor task directories")
    parser.add_argument("--agent", choices=AGENT_NAMES, help="the agent for every task (default: each task's, else "
                        "the server's DEFAULT_AGENT)")
    parser.add_argument("--model", help="model id for LLM agents")
    parser.add_argument("--base-url", help="OpenAI-compatible base URL (its key from --api-key-env)")
    parser.add_argument("--api-key-env", default="OPENAI_API_KEY", metavar="VAR",
                        help="environment variable holding the key for --base-url (default OPENAI_API_KEY); keys are "
                        "never taken from the command line")
    parser.add_argument("--endpoint", help="an endpoint of the server's catalog (openai, vllm, hf_router, ...)")
    parser.add_argument("--attempts", "-k", type=int, default=1, help="rollouts per task (pass@k), default 1")
    parser.add_argument("--concurrency", "-n", type=int, default=1, help="rollouts at once, default 1")
    parser.add_argument("--sandbox", help="sandbox backend (default: the first of SANDBOX_BACKENDS)")
    parser.add_argument("--server", metavar="URL", help="run on this server (over WebSocket) instead of in-process")
    parser.add_argument("--out", type=Path, default=Path("results.jsonl"),
                        help="JSONL journal, one line per rollout; rerunning with it skips what is done")
    parser.add_argument("--ignore-dockerfile", action="store_true",
                        help="run Harbor tasks whose Dockerfile needs Docker on another backend anyway")
    parser.add_argument("--no-progress", action="store_true", help="no live display (counts still printed)")
    parser.add_argument("--results-db", type=Path, help="results store to add the rollouts to (default: "
                        "RESULTS_DB, else STATE_DIR/results.sqlite)")
    parser.add_argument("--no-store", action="store_true", help="keep the rollouts only in --out")


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    overrides: dict[str, Any] = {key: getattr(args, key) for key in ("agent", "model", "endpoint", "sandbox")
                                 if getattr(args, key)}
    if args.base_url:
        key = os.environ.get(args.api_key_env)
        if not key:
            raise InvalidTaskError(f"--base-url needs a key: set {args.api_key_env} (or name another variable with "
                                   "--api-key-env)")
        overrides["base_url"], overrides["api_key"] = args.base_url, SecretStr(key)
    return overrides


class StoreSink:
    """Adds each finished record to the results store, under this batch's run id."""

    def __init__(self, store: ResultsStore, run_id: str) -> None:
        self.store, self.run_id = store, run_id

    def add(self, record: Record) -> None:
        self.store.add(self.run_id, record)


def _describe(args: argparse.Namespace) -> str:
    """The batch's command line, without anything secret (keys never are on it)."""
    return " ".join(["run", *args.tasks, *(f"--{k.replace('_', '-')} {getattr(args, k)}" for k in
                     ("agent", "model", "endpoint", "sandbox", "server", "attempts") if getattr(args, k))])


def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    if args.no_store:
        return _run(args, settings, [])
    with ResultsStore.from_settings(settings, args.results_db) as store:
        run_id = store.new_run("batch", _describe(args))
        return _run(args, settings, [StoreSink(store, run_id)])


def _run(args: argparse.Namespace, settings: Settings, sinks: list[RecordSink]) -> int:
    if args.attempts < 1 or args.concurrency < 1:
        raise InvalidTaskError("--attempts and --concurrency must be at least 1")
    sandbox = args.sandbox or settings.default_backend
    options = TaskOptions(sandbox=sandbox, caps=SandboxLimits.from_settings(settings),
                          ignore_dockerfile=args.ignore_dockerfile)
    plan = BatchPlan(attempts=args.attempts, concurrency=args.concurrency, overrides=_overrides(args))
    executor: Executor = (ServerExecutor(args.server, args.concurrency) if args.server
                          else InProcessExecutor(settings))
    console = Console(stderr=True)
    total = count_tasks(args.tasks) * args.attempts
    progress = LiveProgress(console, total, live=not args.no_progress and console.is_terminal)
    try:
        with progress:
            summary = asyncio.run(run_batch(iter_tasks(args.tasks, options), plan, executor, Journal(args.out),
                                            progress, sinks))
    except KeyboardInterrupt:
        console.print(f"interrupted: {progress.line()}; finished rollouts are in {args.out}; rerun to go on",
                      soft_wrap=True)
        return EXIT_INTERRUPTED
    console.print(progress.line(), soft_wrap=True)
    Console(file=sys.stdout).print(summary_table(summary, args.attempts))
    return 0
