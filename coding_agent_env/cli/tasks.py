"""`coding-agent-env tasks stats`: each task's record in the results store, as the curriculum sampler sees it.

    tasks stats [--run ID] [--task SUBSTRING] [--group-size G] [--limit N]

One line per task (most rollouts first): rollouts, scored attempts, passes, the pass rate under the sampler's
Beta prior, the chance a GRPO group of G carries signal (`1 - p^G - (1 - p)^G`), mean seconds, and the
curriculum's weight for it, normalised so the weights of the tasks listed sum to 1 (`tasks.sampler`).
"""

from __future__ import annotations

import argparse

from coding_agent_env.errors import InvalidTaskError
from coding_agent_env.runs.charts import curriculum_view
from coding_agent_env.runs.store import Filters, ResultsStore, default_path
from coding_agent_env.runs.store_location import location_argument
from coding_agent_env.runs.store_text import escaped
from coding_agent_env.settings import Settings

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("stats",))
    parser.add_argument("--results-db", type=location_argument,
                        help="the store: a SQLite file or a postgresql:// URL (default: RESULTS_DB, else "
                        "STATE_DIR/results.sqlite)")
    parser.add_argument("--run", dest="run_id", help="only this run")
    parser.add_argument("--task", help="task ids containing this")
    parser.add_argument("--group-size", type=int, default=8, help="the trainer's generations per prompt (G)")
    parser.add_argument("--limit", type=int, default=100)


def run(args: argparse.Namespace) -> int:
    if args.group_size < 2:
        raise InvalidTaskError("--group-size must be at least 2")
    path = args.results_db or default_path(Settings.from_env())
    if not path.exists():
        raise InvalidTaskError(f"no results store at {path}")
    with ResultsStore(path) as store:
        outcomes = store.task_outcomes(Filters(args.run_id, args.task))[: max(args.limit, 1)]
    print(f"{'task':40} {'rollouts':>8} {'scored':>6} {'passes':>6} {'p':>6} {'signal':>6} {'mean s':>7} {'weight':>7}")
    for row in curriculum_view(outcomes, args.group_size):
        mean = f"{row['mean s']:7.1f}" if row["mean s"] is not None else f"{'-':>7}"
        print(f"{escaped(row['task'])[:40]:40} {row['rollouts']:8d} {row['scored']:6d} {row['passes']:6d} {row['p']:6.2f} "
              f"{row['signal']:6.2f} {mean} {row['weight']:7.3f}")
    if not outcomes:
        print("no rollouts in the store match")
    return 0
