"""The server-side LLM path: the relay, per-rollout leases and tokens, caps, and turn capture.

A rollout comes in through one door, `access` (see `llm.access`):

    upstream = resolve_upstream(request, settings)                 # EndpointError for refused combinations
    async with access(relay, rollout_id, upstream, settings=settings, ttl_s=..., from_sandbox=...) as llm:
        ... llm.sandbox_relay for the sandbox, llm.for_agent(url) for the agent, llm.revoke() when it is done ...
    turns = llm.turns()

Underneath: one `Relay` per server (a `SharedRelay` starts it on first use and stops it at shutdown), and one
`Lease` per rollout on it.
"""

from coding_agent_env.llm.access import LlmAccess, RolloutLlm, access
from coding_agent_env.llm.lease import Lease, LeaseState
from coding_agent_env.llm.relay import Relay, RelayState
from coding_agent_env.llm.shared import SharedRelay
from coding_agent_env.llm.upstream import Upstream, catalog, resolve_upstream

__all__ = [
    "Lease",
    "LeaseState",
    "LlmAccess",
    "Relay",
    "RelayState",
    "RolloutLlm",
    "SharedRelay",
    "Upstream",
    "access",
    "catalog",
    "resolve_upstream",
]
