"""coding-agent-env: an environment server for reinforcement learning of coding agents.

The in-process entry point is `coding_agent_env.rollout.run_rollout`; the wire models live in
`coding_agent_env.models`.
"""

__version__ = "0.1.0"
