"""Agents: what runs in the sandbox between setup and verify."""

from coding_agent_env.agents.base import Agent, AgentContext
from coding_agent_env.agents.registry import available_agents, get_agent

__all__ = ["Agent", "AgentContext", "available_agents", "get_agent"]
