"""`coding-agent-env run TASKS...`: a batch from the command line.

The end summary (stdout): the counts and scores, the seconds per phase, then what did not pass (each refused or
unloadable task and each rollout that did not pass, with its status and first reason; the most severe 20, then
`... and N more`), and where the rollouts were written: the journal, and how many the results store acknowledged
(each row it lacks named).

Exit codes: 0 when every task loaded and ran and the results store acknowledged every rollout (whatever the
rewards; a rollout ending in an infrastructure error included: it is in the summary and the journal), 1 when any
task was refused or failed to load (the others still ran; the last line says how many), 2 for bad usage, 3 when
any finished rollout is not in the results store (refused, or the store unreachable: it is in `--out`; the last
line says how many; wins over 1), 130 when interrupted (what finished is in `--out`; rerun with the same `--out`
to go on).

`--out` defaults to `STATE_DIR/runs/<run id>.jsonl` (the run id the results store gives the batch, else the time).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from rich.console import Console

from coding_agent_env.errors import InvalidTaskError
from coding_agent_env.models import AGENT_NAMES, Mode
from coding_agent_env.runs.batch import BatchPlan, RecordSink, Sampling, run_batch
from coding_agent_env.runs.executor import Executor, InProcessExecutor, ServerExecutor
from coding_agent_env.runs.journal import Journal
from coding_agent_env.runs.progress import Failures, LiveProgress, summary_table
from coding_agent_env.runs.store import ResultsStore
from coding_agent_env.runs.store_location import location_argument
from coding_agent_env.runs.store_sink import StoreSink
from coding_agent_env.sandbox.base import SandboxLimits
from coding_agent_env.settings import Settings
from coding_agent_env.tasks import TaskOptions, count_tasks, iter_tasks
from coding_agent_env.tasks.images import ImageMapError, parse_image_map
from coding_agent_env.tasks.sampler import SAMPLERS, Curriculum, TaskStats, make_sampler
from coding_agent_env.workspace.redact import Redactor

__all__ = ["EXIT_NOT_RUN", "EXIT_NOT_STORED", "StoreSink", "add_arguments", "run"]

EXIT_NOT_RUN = 1
"""Some task was refused or failed to load."""
EXIT_NOT_STORED = 3
"""Some finished rollout is not in the results store (the store refused it or could not be reached); it is in
the JSONL journal. Wins over `EXIT_NOT_RUN`: a loss is the worse news."""
EXIT_INTERRUPTED = 130
EXIT_HELP = f"""exit status:
  0    every task loaded and ran, and the results store acknowledged every rollout (whatever the rewards)
  {EXIT_NOT_RUN}    some task was refused or failed to load (the others ran); with --server, a server that
       requires a caller token refuses every task without API_TOKEN (the reason names the 401)
  2    bad usage, or the results store could not be opened (nothing ran)
  {EXIT_NOT_STORED}    some finished rollout is not in the results store (it is in --out); wins over {EXIT_NOT_RUN}
  {EXIT_INTERRUPTED}  interrupted (rerun with the same --out to go on)
"""
"""The epilog of `run --help` (and so of the generated command-line reference)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EXIT_HELP
    parser.formatter_class = argparse.RawDescriptionHelpFormatter  # the epilog's table as written
    parser.add_argument("tasks", nargs="+", help="request files (JSON/YAML), JSONL datasets, Harbor task directories")
    parser.add_argument("--agent", choices=AGENT_NAMES, help="the agent for every task (default: each task's, else "
                        "the server's DEFAULT_AGENT)")
    parser.add_argument("--model", help="model id for LLM agents")
    parser.add_argument("--base-url", help="OpenAI-compatible base URL (its key from --api-key-env)")
    parser.add_argument("--api-key-env", default="OPENAI_API_KEY", metavar="VAR",
                        help="environment variable holding the key for --base-url (default OPENAI_API_KEY); keys are "
                        "never taken from the command line")
    parser.add_argument("--mode", choices=[mode.value for mode in Mode],
                        help="black_box (the default) or transparent_proxy (logprobs and token ids for training)")
    parser.add_argument("--max-tokens-cap", type=int, metavar="N",
                        help="bound on max_tokens of every LLM call (0: none)")
    parser.add_argument("--top-logprobs", type=int, metavar="N", help="logprobs per token in transparent_proxy (0-20)")
    parser.add_argument("--endpoint", help="an endpoint of the server's catalog (openai, vllm, hf_router, ...)")
    parser.add_argument("--attempts", "-k", type=int, default=1, help="rollouts per task (pass@k), default 1")
    parser.add_argument("--concurrency", "-n", type=int, default=1, help="rollouts at once, default 1")
    parser.add_argument("--sampler", choices=list(SAMPLERS), help="draw --rollouts tasks with this sampler instead of "
                        "running every task --attempts times (curriculum: learns from each result and from the "
                        "results store's earlier ones)")
    parser.add_argument("--rollouts", type=int, metavar="N", help="with --sampler: how many rollouts to draw")
    parser.add_argument("--group-size", type=int, default=8, metavar="G",
                        help="with --sampler curriculum: the trainer's group size (default 8)")
    parser.add_argument("--sandbox", help="sandbox backend (default: the first of SANDBOX_BACKENDS)")
    parser.add_argument("--server", metavar="URL", action="append", default=None,
                        help="run on this server (over WebSocket) instead of in-process; repeat it (or give "
                        "comma-separated URLs) to spread the rollouts across several servers")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSONL journal, one line per rollout; rerunning with it skips what is done (default: "
                        "STATE_DIR/runs/<run id>.jsonl, a new one per run)")
    parser.add_argument("--ignore-dockerfile", action="store_true",
                        help="run Harbor tasks whose Dockerfile needs Docker on another backend anyway")
    parser.add_argument("--no-progress", action="store_true", help="no live display (counts still printed)")
    parser.add_argument("--results-db", type=location_argument, help="results store to add the rollouts to, a "
                        "SQLite file or a postgresql:// URL (default: RESULTS_DB, else STATE_DIR/results.sqlite)")
    parser.add_argument("--no-store", action="store_true", help="keep the rollouts only in --out")
    parser.add_argument("--image-map", action="append", default=[], metavar="FROM=TO",
                        help="rewrite a base image before a task's image is built (and a prebuilt task image): "
                        "FROM an exact reference or a registry/repository prefix; repeatable, added to IMAGE_MAP")


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    overrides: dict[str, Any] = {key: getattr(args, key) for key in ("agent", "model", "endpoint", "sandbox")
                                 if getattr(args, key)}
    # Applied to each loaded request as they are (model_copy): each checked here as the request model would.
    if args.mode:
        overrides["mode"] = Mode(args.mode)
    if args.max_tokens_cap is not None:
        if args.max_tokens_cap < 0:
            raise InvalidTaskError("--max-tokens-cap must be 0 (no cap) or a positive number of tokens")
        overrides["max_tokens_cap"] = args.max_tokens_cap or None
    if args.top_logprobs is not None:
        if not 0 <= args.top_logprobs <= 20:
            raise InvalidTaskError("--top-logprobs must be between 0 and 20")
        overrides["top_logprobs"] = args.top_logprobs
    if args.base_url:
        key = os.environ.get(args.api_key_env)
        if not key:
            raise InvalidTaskError(f"--base-url needs a key: set {args.api_key_env} (or name another variable with "
                                   "--api-key-env)")
        overrides["base_url"], overrides["api_key"] = args.base_url, SecretStr(key)
    return overrides


def _describe(args: argparse.Namespace) -> str:
    """The batch's command line, without anything secret (keys never are on it)."""
    return " ".join(["run", *args.tasks, *(f"--{k.replace('_', '-')} {_shown(getattr(args, k))}" for k in
                     ("agent", "model", "endpoint", "sandbox", "server", "attempts") if getattr(args, k))])


def _shown(value: Any) -> str:
    return ",".join(value) if isinstance(value, list) else str(value)


def _servers(args: argparse.Namespace) -> tuple[str, ...]:
    """`--server`'s URLs (repeated and/or comma-separated), each once, in order; none: in-process."""
    if args.server is None:
        return ()
    urls = dict.fromkeys(url.strip().rstrip("/") for value in args.server for url in value.split(","))
    urls.pop("", None)
    if not urls:
        raise InvalidTaskError("--server needs a URL")
    return tuple(urls)


def _sampling(args: argparse.Namespace, store: Path | None) -> Sampling | None:
    """`--sampler` / `--rollouts`, checked; a curriculum starts from what the results store knows of each task."""
    if args.sampler is None:
        if args.rollouts is not None:
            raise InvalidTaskError("--rollouts goes with --sampler")
        return None
    if args.rollouts is None or args.rollouts < 1:
        raise InvalidTaskError("--sampler needs --rollouts N (at least 1)")
    if args.attempts != 1:
        raise InvalidTaskError("--sampler draws tasks itself: leave --attempts at 1")
    try:
        sampler = make_sampler(args.sampler, **({"group_size": args.group_size} if args.sampler == "curriculum" else {}))
    except ValueError as exc:
        raise InvalidTaskError(f"--group-size: {exc}") from None
    if isinstance(sampler, Curriculum) and store is not None:
        with ResultsStore(store) as known:
            for task, _, scored, passes, seconds in known.task_outcomes():
                sampler.stats[task] = TaskStats(scored, passes, seconds)
    return Sampling(sampler, args.rollouts)


def _image_map(args: argparse.Namespace, settings: Settings) -> dict[str, str]:
    """IMAGE_MAP's rules, then --image-map's (which win for the same FROM)."""
    try:
        return {**settings.image_map, **parse_image_map(args.image_map)}
    except ImageMapError as exc:
        raise InvalidTaskError(f"--image-map: {exc}") from None


def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    image_map = _image_map(args, settings)
    if image_map != settings.image_map:
        settings = settings.model_copy(update={"image_map": image_map})  # what the in-process builds map
    if args.no_store:
        return _run(args, settings, None, f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}")
    with ResultsStore.from_settings(settings, args.results_db) as store:
        run_id = store.new_run("batch", _describe(args))
        return _run(args, settings, StoreSink(store, run_id), run_id)


def _run(args: argparse.Namespace, settings: Settings, sink: StoreSink | None, run_id: str) -> int:
    if args.attempts < 1 or args.concurrency < 1:
        raise InvalidTaskError("--attempts and --concurrency must be at least 1")
    store = sink.store.path if sink is not None else None
    sinks: list[RecordSink] = [sink] if sink is not None else []
    sampling = _sampling(args, store)
    out: Path = args.out or settings.state_dir / "runs" / f"{run_id}.jsonl"
    sandbox = args.sandbox or settings.default_backend
    options = TaskOptions(sandbox=sandbox, caps=SandboxLimits.from_settings(settings),
                          ignore_dockerfile=args.ignore_dockerfile, image_map=settings.image_map)
    overrides = _overrides(args)
    plan = BatchPlan(attempts=args.attempts, concurrency=args.concurrency, overrides=overrides)
    servers = _servers(args)
    console = Console(stderr=True)
    executor: Executor = (ServerExecutor(servers, args.concurrency, notice=lambda line: console.print(
        line, soft_wrap=True, markup=False, highlight=False)) if servers else InProcessExecutor(settings))
    total = sampling.rollouts if sampling is not None else count_tasks(args.tasks) * args.attempts
    key = overrides.get("api_key")
    failures = Failures(redactor=Redactor([key.get_secret_value() if key is not None else None]))
    progress = LiveProgress(console, total, live=not args.no_progress and console.is_terminal, failures=failures)
    try:
        with progress:
            summary = asyncio.run(run_batch(iter_tasks(args.tasks, options), plan, executor, Journal(out),
                                            progress, sinks, sampling))
    except KeyboardInterrupt:
        again = "" if args.out else f" with --out {out}"
        console.print(f"interrupted: {progress.line()}; finished rollouts are in {out}; rerun{again} to go on",
                      soft_wrap=True)
        for line in sink.lines(str(out)) if sink is not None else []:
            console.print(line, soft_wrap=True, markup=False, highlight=False)
        return EXIT_INTERRUPTED
    console.print(progress.line(), soft_wrap=True)
    stdout = Console(file=sys.stdout)
    stdout.print(summary_table(summary, args.attempts))
    for line in failures.lines():
        stdout.print(line, soft_wrap=True, markup=False, highlight=False)
    for line in executor.report() if isinstance(executor, ServerExecutor) else []:
        stdout.print(line, soft_wrap=True, markup=False, highlight=False)
    for line in _stored_lines(sink, out, run_id):
        stdout.print(line, soft_wrap=True, markup=False, highlight=False)
    if sink is not None and sink.missing:
        stdout.print(f"exit status {EXIT_NOT_STORED}: {sink.missing} of {sink.handed} rollouts not in the results "
                     "store", soft_wrap=True, markup=False, highlight=False)
        return EXIT_NOT_STORED
    last = failures.exit_line()
    if last is None:
        return 0
    stdout.print(last, soft_wrap=True, markup=False, highlight=False)
    return EXIT_NOT_RUN


def _stored_lines(sink: StoreSink | None, out: Path, run_id: str) -> list[str]:
    """Where the rollouts went: the journal, and how many of them the results store acknowledged (each row it
    lacks named)."""
    if sink is None:
        return [f"rollouts written to {out}"]
    if not sink.missing:
        return [f"rollouts written to {out} and the results store {sink.store.path} (run {run_id})"]
    return [f"rollouts written to {out}; {sink.acknowledged} of {sink.handed} to the results store {sink.store.path} "
            f"(run {run_id})", *sink.lines(str(out))]
