"""One rollout's way into the LLM path, as one async context.

    async with access(relay, rollout_id, upstream, settings=s, ttl_s=deadline, from_sandbox=True) as llm:
        redact = Redactor(llm.secrets)                                   # the upstream key and the token
        spec = SandboxSpec(..., network="llm", relay=llm.sandbox_relay)  # None: the agent calls from the server
        ctx = AgentContext(..., llm=llm.for_agent(sandbox.relay_url))    # base URL + token + model
        ...                                                              # the agent runs
        await llm.revoke()                                               # as soon as the agent's phase ends
    turns = llm.turns()                                                  # still there after the exit

Entering opens a lease (a fresh per-rollout token bound to `upstream`, expiring after `ttl_s`) on `relay`: the
server's (a running `Relay`, or the `SharedRelay` that starts it on first use) or, with None, a private relay
started for this rollout and stopped at the exit. The exit always revokes the token, whatever ended the body,
shielded from cancellation: calls still in flight end and are recorded as turns. `revoke()` does the same
earlier and is idempotent. The agent gets the relay's URL and the token, never the upstream key.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from coding_agent_env.aio import shielded
from coding_agent_env.errors import RelayError
from coding_agent_env.llm.relay_endpoint import sandbox_endpoint
from coding_agent_env.llm.lease import Lease
from coding_agent_env.llm.relay import Relay
from coding_agent_env.llm.shared import SharedRelay
from coding_agent_env.llm.upstream import Upstream
from coding_agent_env.models import Turn
from coding_agent_env.sandbox.base import RelayEndpoint
from coding_agent_env.settings import Settings

__all__ = ["LlmAccess", "RolloutLlm", "access"]


@dataclass(frozen=True)
class LlmAccess:
    """How an agent reaches its LLM: the relay (as seen from inside the sandbox, or from the server for an
    agent whose calls do not come from the sandbox: `Agent.llm_from_sandbox`), and a per-rollout token (use it
    as the OpenAI api_key; it is worthless outside this rollout). Never the upstream key."""

    base_url: str
    token: str
    model: str


class RolloutLlm:
    """A rollout's open LLM access, from `access()`."""

    def __init__(self, lease: Lease, sandbox_relay: RelayEndpoint | None) -> None:
        self._lease = lease
        self._sandbox_relay = sandbox_relay

    @property
    def sandbox_relay(self) -> RelayEndpoint | None:
        """The relay for the sandbox spec (network `llm`) when the agent calls from the sandbox; None when it
        calls from the server, whose sandbox then needs no network."""
        return self._sandbox_relay

    @property
    def secrets(self) -> tuple[str, ...]:
        """What no text leaving the server may hold: the upstream key (when there is one) and the token."""
        key = self._lease.upstream.secret()
        return (self._lease.token,) if key is None else (key, self._lease.token)

    def for_agent(self, sandbox_relay_url: str | None) -> LlmAccess:
        """What the agent is given. One calling from the sandbox gets `sandbox_relay_url`, the relay as the
        sandbox's processes see it (`Sandbox.relay_url`; `RelayError` if the sandbox has none); one calling from
        the server gets the relay's loopback listener."""
        if self._sandbox_relay is None:
            base_url = self._lease.base_url
        elif sandbox_relay_url is None:
            raise RelayError("the sandbox has no relay URL although its network policy is llm")
        else:
            base_url = sandbox_relay_url
        return LlmAccess(base_url=base_url, token=self._lease.token, model=self._lease.upstream.model or "")

    async def revoke(self) -> None:
        """Revoke the token now: every later call gets 401, calls in flight end and are recorded. Idempotent;
        finishes even if the caller is cancelled meanwhile."""
        await shielded(self._lease.close())

    def turns(self) -> list[Turn]:
        """Every call recorded so far, in arrival order; complete once revoked."""
        return self._lease.turns()


@asynccontextmanager
async def access(
    relay: Relay | SharedRelay | None,
    rollout_id: str,
    upstream: Upstream,
    *,
    settings: Settings,
    ttl_s: float,
    from_sandbox: bool,
) -> AsyncIterator[RolloutLlm]:
    """See the module docstring. `from_sandbox`: the agent's calls come from inside the sandbox (a CLI agent),
    so the sandbox needs the relay (`sandbox_relay`). `RelayError` if the relay cannot be started or used."""
    private: Relay | None = None
    try:
        if relay is None:
            relay = private = Relay(settings)
            await private.start()
        elif isinstance(relay, SharedRelay):
            relay = await relay.get()
        lease = await relay.open_lease(rollout_id, upstream, ttl_s=ttl_s)
        try:
            endpoint = sandbox_endpoint(lease, settings.public_relay_url) if from_sandbox else None
            yield RolloutLlm(lease, endpoint)
        finally:
            await shielded(lease.close())
    finally:
        if private is not None:
            await shielded(private.stop())
