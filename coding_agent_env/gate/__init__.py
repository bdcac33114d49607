"""Trainer-side gate: an OpenAI-compatible server where the trainer answers each agent call.

Imports only the package's wire layer (models, errors, settings), so a trainer can use it without the server.
"""

from coding_agent_env.gate.gate import Gate, GateRollout
from coding_agent_env.gate.state import GateRequest

__all__ = ["Gate", "GateRequest", "GateRollout"]
