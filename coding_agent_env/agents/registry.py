"""Agents by name, imported lazily. A name the models accept but this server cannot run is refused with
`UnknownAgentError` before anything starts."""

from __future__ import annotations

import importlib

from coding_agent_env.agents.base import Agent
from coding_agent_env.agents.driver import CliAgent
from coding_agent_env.agents.spec import CliAgentSpec
from coding_agent_env.errors import UnknownAgentError
from coding_agent_env.models import AGENT_NAMES

__all__ = ["AGENTS", "available_agents", "cli_specs", "get_agent"]

AGENTS: dict[str, str] = {
    "oracle": "coding_agent_env.agents.oracle:OracleAgent",
    "nop": "coding_agent_env.agents.oracle:NopAgent",
    "opencode": "coding_agent_env.agents.opencode:OPENCODE",
    "pi": "coding_agent_env.agents.pi:PI",
    "terminus": "coding_agent_env.agents.terminus.agent:TerminusAgent",
    "qwen-code": "coding_agent_env.agents.qwen_code:QWEN_CODE",
    "mini-swe-agent": "coding_agent_env.agents.mini_swe_agent:MINI_SWE_AGENT",
    "claude-code": "coding_agent_env.agents.claude_code:CLAUDE_CODE",
    "codex": "coding_agent_env.agents.codex:CODEX",
    "gemini-cli": "coding_agent_env.agents.gemini_cli:GEMINI_CLI",
}
"""name -> import path of the agent class, or of a CLI agent's declarative spec (run by `CliAgent`)."""


def available_agents() -> list[str]:
    return list(AGENTS)


def get_agent(name: str) -> Agent:
    target = AGENTS.get(name)
    if target is None:
        known = ", ".join(AGENTS)
        if name in AGENT_NAMES:
            raise UnknownAgentError(f"agent {name!r} is not available on this server (available: {known})")
        raise UnknownAgentError(f"unknown agent {name!r} (available: {known})")
    module_name, _, attr = target.partition(":")
    found: type[Agent] | CliAgentSpec = getattr(importlib.import_module(module_name), attr)
    return CliAgent(found) if isinstance(found, CliAgentSpec) else found()


def cli_specs() -> list[CliAgentSpec]:
    """The specs of the registered agents that are declarative CLI agents (imports them)."""
    agents = [get_agent(name) for name in AGENTS]
    return [agent.spec for agent in agents if isinstance(agent, CliAgent)]
