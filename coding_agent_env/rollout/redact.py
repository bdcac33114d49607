"""The old import path of `workspace.redact` (the batch runner's executor uses it)."""

from coding_agent_env.workspace.redact import REDACTED, Redactor, encodable

__all__ = ["REDACTED", "Redactor", "encodable"]
