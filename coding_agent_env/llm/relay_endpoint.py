"""What a sandbox needs to reach the relay (`sandbox.base.RelayEndpoint`): its socket, its loopback URL, a
forwarder file it can read, and the relay's `serve_listener` (for a backend that makes the agent's listening
socket itself).

The forwarder is copied next to the relay's socket (under the state dir, traversable by sandbox uids), since
the installed package itself may live somewhere sandbox uids cannot read (e.g. under /root).
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

from coding_agent_env.llm.lease import Lease
from coding_agent_env.sandbox.base import RelayEndpoint

__all__ = ["sandbox_endpoint"]

_FORWARDER = Path(__file__).with_name("forwarder.py")


def sandbox_endpoint(lease: Lease, public_url: str | None = None) -> RelayEndpoint:
    """The relay as a sandbox spec names it, for the rollout holding `lease`; `public_url` is the server's public
    relay route (default: the relay's own listener, reachable by an engine on this host)."""
    return RelayEndpoint(
        socket_path=str(lease.socket_path),
        tcp_url=lease.base_url,
        forwarder_path=str(_readable_forwarder(lease.socket_path.parent)),
        public_url=public_url or lease.base_url,
        serve=lease.serve,
    )


@functools.cache
def _forwarder_source() -> tuple[bytes, str]:
    """The forwarder's source and its digest, read once per process (the installed package does not change
    under a running server)."""
    source = _FORWARDER.read_bytes()
    return source, hashlib.sha256(source).hexdigest()[:16]


def _readable_forwarder(directory: Path) -> Path:
    source, digest = _forwarder_source()
    target = directory / f"forwarder-{digest}.py"
    if not target.exists():
        partial = directory / f".{target.name}.{os.getpid()}"
        partial.write_bytes(source)
        os.chmod(partial, 0o644)
        os.replace(partial, target)  # atomic: concurrent rollouts never see a half-written file
    return target
