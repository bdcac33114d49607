"""The rollout pipeline: RolloutRequest in, RolloutResult out.

`run_rollout` is imported on first access, so that light users of this package (the client needs only
`workspace.budget`) do not load the sandbox, agent and relay machinery.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from coding_agent_env.rollout.pipeline import run_rollout

__all__ = ["run_rollout"]


def __getattr__(name: str) -> Any:
    if name == "run_rollout":
        from coding_agent_env.rollout.pipeline import run_rollout

        return run_rollout
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
