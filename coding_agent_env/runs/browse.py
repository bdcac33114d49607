"""`coding-agent-env runs`: what the results store holds.

    runs list [--runs] [filters]        the newest rollouts (or runs), one line each
    runs show ROLLOUT_ID                one rollout's whole result (JSON)
    runs export [filters] [-o FILE]     matching rollouts as JSONL (default stdout)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from coding_agent_env.errors import InvalidTaskError
from coding_agent_env.runs.store import Filters, ResultsStore, default_path
from coding_agent_env.runs.store_location import location_argument
from coding_agent_env.runs.store_text import dump_result, escaped
from coding_agent_env.settings import Settings

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("list", "show", "export"))
    parser.add_argument("rollout_id", nargs="?", help="for show")
    parser.add_argument("--results-db", type=location_argument,
                        help="the store: a SQLite file or a postgresql:// URL (default: RESULTS_DB, else "
                        "STATE_DIR/results.sqlite)")
    parser.add_argument("--runs", action="store_true", help="list runs instead of rollouts")
    parser.add_argument("--run", dest="run_id", help="only this run")
    parser.add_argument("--task", help="task ids containing this")
    parser.add_argument("--agent")
    parser.add_argument("--status")
    parser.add_argument("--min-reward", type=float)
    parser.add_argument("--max-reward", type=float)
    parser.add_argument("--limit", type=int, default=50)
    parser.add_argument("-o", "--output", type=Path, help="export to this file")


def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    path = args.results_db or default_path(settings)
    if not path.exists():
        raise InvalidTaskError(f"no results store at {path}")
    filters = Filters(args.run_id, args.task, args.agent, args.status, args.min_reward, args.max_reward)
    with ResultsStore(path) as store:
        if args.action == "show":
            result = store.result(args.rollout_id or "")
            if result is None:
                raise InvalidTaskError(f"no rollout {args.rollout_id!r} in {path}")
            print(dump_result(result, indent=2))
        elif args.action == "export":
            if args.output:
                with args.output.open("w", encoding="utf-8") as out:
                    count = store.export(out, filters)
                print(f"{count} rollouts written to {args.output}", file=sys.stderr)
            else:  # `runs export | head`: a closed pipe ends the command quietly (cli.main)
                store.export(sys.stdout, filters)
        elif args.runs:
            for r in store.runs(args.limit):
                mean = "-" if r.mean_reward is None else f"{r.mean_reward:.3f}"
                print(f"{r.run_id}  {_when(r.started)}  {r.origin:6}  {r.rollouts:6} rollouts  mean {mean}  "
                      f"{escaped(r.description)}")
        else:
            for row in store.rollouts(filters, args.limit):
                reward = "-" if row.reward is None else f"{row.reward:.3f}"
                # Shown as stored (`store_text.escaped`): NUL and lone surrogates as `\uXXXX`, never raw.
                print(f"{escaped(row.rollout_id)}  {_when(row.finished)}  {escaped(row.task_id)}#{row.attempt}  "
                      f"{escaped(row.agent)}  {escaped(row.sandbox)}  {row.status}  reward {reward}  {row.wall_s:.1f}s")
    return 0


def _when(stamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))
