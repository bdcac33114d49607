"""The built-in Terminus agent, as a `CliAgentSpec` the generic driver runs.

Design: the loop (`terminus.loop`, standard library only) runs *inside* the sandbox, as a Python process the
driver spawns like any CLI agent. So it gets exactly what OpenCode and Pi get: the relay at the sandbox's
relay URL with the per-rollout token (its turns are recorded like any agent's), the same deadline and the
same process-tree kill, and no access to the server. Its commands run next to it with persistent shell state
(`terminus.shell`). Nothing is installed: the three modules are written into the agent dir per rollout
(a few KB) and run with the sandbox's own `python3 -I`.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from coding_agent_env.agents.driver import CliAgent
from coding_agent_env.agents.events import AgentReport, json_lines
from coding_agent_env.agents.spec import AgentFile, CliAgentSpec, Launch, LaunchContext
from coding_agent_env.settings import Settings

__all__ = ["TERMINUS", "TerminusAgent", "TerminusConfig", "parse_terminus_events"]

VERSION = "1.0.0"
_SHIPPED = ("parse.py", "shell.py", "loop.py")
_PACKAGE = "terminus_agent"
_BOOT = "import sys; sys.path.insert(0, sys.argv[1]); from terminus_agent.loop import main; sys.exit(main(sys.argv[2:]))"
"""A constant program: its arguments (package dir, config path) carry no secret and no instruction."""


@dataclass(frozen=True)
class TerminusConfig:
    """The loop's limits, from `Settings.terminus_*` (defined there, once)."""

    max_turns: int
    command_timeout_s: float
    max_output_bytes: int
    llm_timeout_s: float
    loose_parsing: bool

    @classmethod
    def from_settings(cls, settings: Settings) -> TerminusConfig:
        return cls(
            max_turns=settings.terminus_max_turns,
            command_timeout_s=settings.terminus_command_timeout_s,
            max_output_bytes=settings.terminus_max_output_bytes,
            llm_timeout_s=settings.terminus_llm_timeout_s,
            loose_parsing=settings.terminus_loose_parsing,
        )


@functools.cache
def _sources() -> dict[str, str]:
    here = Path(__file__).parent
    return {name: (here / name).read_text(encoding="utf-8") for name in _SHIPPED}


def render(ctx: LaunchContext) -> Launch:
    config = TerminusConfig.from_settings(ctx.settings)
    package_root = f"{ctx.agent_dir}/py"
    files = [AgentFile(f"{package_root}/{_PACKAGE}/__init__.py", "", mode=0o644)]
    files += [AgentFile(f"{package_root}/{_PACKAGE}/{name}", text, mode=0o644) for name, text in _sources().items()]
    loop_config = {**asdict(config), "base_url": ctx.base_url, "model": ctx.model,
                   "state_dir": f"{ctx.agent_dir}/terminus"}
    config_path = f"{ctx.agent_dir}/terminus.json"
    files.append(AgentFile(config_path, json.dumps(loop_config)))
    argv = ("python3", "-I", "-c", _BOOT, package_root, config_path)
    return Launch(argv=argv, env={"TERMINUS_API_KEY": ctx.token}, files=tuple(files))


def parse_terminus_events(text: str) -> AgentReport:
    """Total: any text gives a report (see `events.json_lines` for the bounds)."""
    report = AgentReport()
    for event in json_lines(text, report):
        kind = event.get("type")
        if kind == "turn":
            report.steps += 1
        elif kind == "command":
            report.add_tool("terminal", event.get("command"))
        elif kind in ("text", "final"):
            report.add_text(event.get("text"))
        elif kind in ("error", "parse_failure"):
            report.add_error(event.get("error") or event.get("reason"))
    return report


TERMINUS = CliAgentSpec(
    name="terminus",
    version=VERSION,
    installs=(),
    version_package=None,
    render=render,
    parse_events=parse_terminus_events,
)


class TerminusAgent(CliAgent):
    name = "terminus"
    spec = TERMINUS
