"""`coding-agent-env agents install [NAME ...]` and `coding-agent-env agents list [NAME ...]`.

`install` puts the pinned npm packages of the CLI agents into `Settings.agents_dir` (idempotent: an agent
already installed at its pinned version is skipped); `list` prints each agent, its pinned version and whether
it is installed, as JSON. Both take the agents to act on (default: all) and exit 1 when one of those is (still)
not installed; an unknown name is an error naming the known ones.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from coding_agent_env.agents.install import InstallStatus, install, status
from coding_agent_env.agents.registry import cli_specs
from coding_agent_env.errors import UnknownAgentError
from coding_agent_env.settings import Settings

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="agents_command", required=True)
    installer = actions.add_parser("install", help="install the pinned CLI agents into the agents directory")
    installer.add_argument("names", nargs="*", help="agents to install (default: all)")
    lister = actions.add_parser("list", help="show each agent's pinned version and whether it is installed")
    lister.add_argument("names", nargs="*", help="agents to show (default: all)")


def agent_statuses(settings: Settings) -> list[InstallStatus]:
    return [status(spec, settings.agents_dir) for spec in cli_specs()]


def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    specs = cli_specs()
    known = {spec.name: spec for spec in specs}
    unknown = [name for name in args.names if name not in known]
    if unknown:
        raise UnknownAgentError(f"unknown agent(s) {', '.join(unknown)} (known: {', '.join(known)})")
    chosen = [known[name] for name in args.names] if args.names else specs
    if args.agents_command == "install":
        results = [install(spec, settings.agents_dir) for spec in chosen]
    else:
        results = [status(spec, settings.agents_dir) for spec in chosen]
    report = {"agents_dir": str(settings.agents_dir), "agents": [asdict(found) for found in results]}
    print(json.dumps(report, indent=2))
    return 0 if all(found.installed for found in results) else 1
