"""The server-side LLM relay: per-rollout tokens, caps, and turn capture.

    relay = Relay(settings); await relay.start()                  # once per server process
    upstream = resolve_upstream(request, settings)                 # EndpointError for refused combinations
    lease = await relay.open_lease(rollout_id, upstream)           # lease.base_url, lease.socket_path, lease.token
    ... the agent calls lease.base_url with api_key=lease.token ...
    await lease.close(); turns = lease.turns()                     # revoke once the agent is done
    await relay.stop()
"""

from coding_agent_env.llm.lease import Lease, LeaseState
from coding_agent_env.llm.relay import Relay, RelayState
from coding_agent_env.llm.upstream import Upstream, catalog, resolve_upstream

__all__ = ["Lease", "LeaseState", "Relay", "RelayState", "Upstream", "catalog", "resolve_upstream"]
