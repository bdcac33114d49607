"""The `coding-agent-env` command.

    coding-agent-env rollout TASK [--json]     run one rollout locally (TASK: JSON/YAML file, or - for stdin)
    coding-agent-env run TASKS... [...]        a batch: many tasks, k attempts, progress, JSONL, a summary
    coding-agent-env runs list|show|export     what the results store holds
    coding-agent-env tasks stats               each task's pass rate, signal and curriculum weight, from the store
    coding-agent-env check                     report which sandbox backends and agents can run here
    coding-agent-env agents install|list       install the pinned CLI agents once / show what is installed
    coding-agent-env gate [...]                run the trainer-side LLM gate
    coding-agent-env serve [ENV_DIR]           serve this environment (or an OpenEnv env dir) over HTTP

Invalid input ends with a one-line message on stderr and exit code 2; a rollout that ran exits 0 whatever
its reward, and one that raised instead of giving a result prints its infra_error result (the error typed),
never a traceback. A reader that closes the pipe early (`runs list | head`) ends the command quietly with
status 141, as a shell reports a process killed by SIGPIPE.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from coding_agent_env import serve
from coding_agent_env.cli import agents as agents_cli
from coding_agent_env.cli import tasks as tasks_cli
from coding_agent_env.agents.registry import available_agents
from coding_agent_env.errors import CodingAgentEnvError, InvalidTaskError
from coding_agent_env.models import RolloutRequest, RolloutResult
from coding_agent_env.rollout import run_rollout
from coding_agent_env.runs import browse as runs_browse
from coding_agent_env.runs import command as runs_command
from coding_agent_env.runs.executor import failed_result
from coding_agent_env.sandbox.registry import Backends
from coding_agent_env.settings import Settings

__all__ = ["main"]

EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE: what a shell reports for `cmd | head` when cmd is killed by the signal, as C tools are."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="coding-agent-env", description="Environment server for coding agents.")
    commands = parser.add_subparsers(dest="command", required=True)
    rollout = commands.add_parser("rollout", help="run one rollout locally and print its result")
    rollout.add_argument("task", help="a JSON or YAML file with RolloutRequest fields, or - for stdin")
    rollout.add_argument("--json", action="store_true", help="print the full RolloutResult as JSON")
    rollout.add_argument("--agent", help="override the task's agent")
    runs_command.add_arguments(commands.add_parser("run", help="run a batch of tasks (request files, JSONL, Harbor "
                                                   "task directories) with progress, a resumable JSONL and a summary"))
    runs_browse.add_arguments(commands.add_parser("runs", help="list, show or export (JSONL) the results store"))
    tasks_cli.add_arguments(commands.add_parser("tasks", help="each task's record in the results store, as the "
                                                "curriculum sampler weighs it (`tasks stats`)"))
    commands.add_parser("check", help="report which sandbox backends and agents can run here")
    agents_cli.add_arguments(commands.add_parser("agents", help="install or list the pinned CLI agents"))
    serve.add_arguments(commands.add_parser("serve", help="serve this environment, or an OpenEnv env directory"))
    commands.add_parser("gate", help="run the trainer-side LLM gate (`gate --help` for its options)", add_help=False)
    return parser


def load_task(source: str) -> RolloutRequest:
    """Parse a task file (or stdin for `-`) into a request; InvalidTaskError with a one-line reason."""
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidTaskError(f"cannot read task {source!r}: {getattr(exc, 'strerror', None) or exc}") from exc
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidTaskError(f"task {source!r} is not valid JSON or YAML: {str(exc).splitlines()[0]}") from exc
    if not isinstance(data, dict):
        raise InvalidTaskError(f"task {source!r} must be a mapping of RolloutRequest fields")
    try:
        return RolloutRequest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "task"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise InvalidTaskError(f"invalid task {source!r}: {where}: {first['msg']}{more}") from exc


def summary(result: RolloutResult) -> str:
    reward = "null" if result.reward is None else f"{result.reward:.3f}"
    lines = [
        f"rollout {result.rollout_id}  agent={result.agent}  sandbox={result.sandbox} ({result.isolation}, "
        f"network {result.network})",
        f"status={result.status.value}  reward={reward}  agent_exit_code={result.agent_exit_code}",
    ]
    for title, results in (("setup", result.setup_results), ("verify", result.verify_results)):
        for cmd in results:
            mark = "ok " if cmd.ok else ("TIMEOUT" if cmd.timed_out else f"exit {cmd.exit_code}")
            lines.append(f"  {title:6} [{mark}] {cmd.cmd[:100]}  ({cmd.duration_s:.2f}s)")
    if result.reward_note:
        lines.append(f"note: {result.reward_note}")
    if result.error:
        lines.append(f"error: {result.error}")
    lines.append(f"files: {len(result.files)} collected, {len(result.files_extra)} omitted; total {result.wall_s:.2f}s")
    return "\n".join(lines)


def _cmd_rollout(args: argparse.Namespace) -> int:
    request = load_task(args.task)
    if args.agent:
        request = RolloutRequest.model_validate({**request.model_dump(), "agent": args.agent})
    settings = Settings.from_env()
    try:
        result = asyncio.run(run_rollout(request, settings=settings))
    except CodingAgentEnvError:
        raise  # refused before anything ran: main says why (exit 2)
    except Exception as exc:  # noqa: BLE001 - the rollout's own result, as a batch would write it
        logging.getLogger(__name__).debug("rollout raised instead of giving a result", exc_info=True)
        result = failed_result(request, exc, sandbox=settings.default_backend)
    print(result.model_dump_json(indent=2) if args.json else summary(result))
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    report: dict[str, Any] = {"backends": asyncio.run(_check_backends(settings)), "agents": available_agents()}
    report["installed"] = {found.name: found.detail for found in agents_cli.agent_statuses(settings)}
    print(json.dumps(report, indent=2))
    return 0 if all(b["available"] for b in report["backends"].values()) else 1


async def _check_backends(settings: Settings) -> dict[str, dict[str, Any]]:
    report: dict[str, dict[str, Any]] = {}
    async with Backends(settings) as backends:
        for name in backends.names:
            try:
                status = backends.get(name).check()
                report[name] = {"available": status.available, "isolation": status.isolation,
                                "detail": status.detail, "limits": dict(status.limits),
                                "limit_scopes": dict(status.limit_scopes)}
                if status.available and status.isolation == "none":
                    report[name]["warning"] = ("isolation is off: commands run as plain host processes with the "
                                               "host's network (the operator's opt-in)")
            except CodingAgentEnvError as exc:
                report[name] = {"available": False, "detail": str(exc)}
    return report


def _cmd_gate(gate_args: list[str]) -> int:
    # Imported here: the gate's HTTP stack is only needed by this command.
    from coding_agent_env.gate.process import main as gate_main

    return gate_main(gate_args)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["gate"]:
        return _cmd_gate(argv[1:])  # the gate parses its own options, --help included
    args = _parser().parse_args(argv)
    handlers = {"rollout": _cmd_rollout, "check": _cmd_check, "serve": serve.serve, "agents": agents_cli.run,
                "run": runs_command.run, "runs": runs_browse.run, "tasks": tasks_cli.run}
    try:
        status = handlers[args.command](args)
        sys.stdout.flush()  # inside the try: a closed pipe surfaces here, not at interpreter exit
        return status
    except BrokenPipeError:
        return _stdout_closed()
    except CodingAgentEnvError as exc:
        print(f"coding-agent-env: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ValidationError as exc:
        print(f"coding-agent-env: {exc.errors()[0]['msg']}", file=sys.stderr)
        return EXIT_USAGE


def _stdout_closed() -> int:
    """The reader of stdout went away: no traceback, and nothing more written to the closed pipe.

    Python flushes stdout again at exit, which would raise (and print "Exception ignored") a second time, so
    stdout's descriptor is pointed at /dev/null first, as the Python documentation's note on SIGPIPE advises.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)
    return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
