"""`Landlocked`: the local backend's strategy where bubblewrap cannot make namespaces but Landlock works (an
unprivileged container, a Hugging Face Space), or where the operator chose it (`LOCAL_ISOLATION=landlock`).

Commands run in the sandbox's host directories at their host paths, as `Unisolated` ones do, but each confines
itself first (`sandbox.landlock`): read-only system trees and the agents' directory; read-write only this
sandbox's workspace, home, tmp and logs (a `fresh` command: its workspace, logs and fresh home instead of home
and tmp); no TCP at all, except, for a spawned command under network `llm`, connect to the relay's own loopback
port (so setup and verify never reach it); no signal, ptrace, `/proc/PID` secrets or abstract socket of anything
outside its own domain; the seccomp filter; rlimits; as root, the sandbox's own uid and control groups.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

from coding_agent_env.sandbox.base import RelayEndpoint
from coding_agent_env.sandbox.landlock import Policy, confine_argv, landlock_refusal, system_paths
from coding_agent_env.sandbox.local.launch import Box, Command, Unisolated
from coding_agent_env.sandbox.local.layout import DEFAULT, Identity
from coding_agent_env.sandbox.local.proc import HostCredentials

__all__ = ["Landlocked", "landlocked"]

_FRESH = "fresh"
"""The prefix of a `fresh` command's home directory under the sandbox root."""


def landlocked(uid: int | None, why_not_bwrap: str, max_processes: int) -> Landlocked | str:
    """The strategy, tried for real (as `uid`: a server running as root), or why Landlock is unusable here.
    `max_processes`: without root, each command may start that many processes beyond those the server's uid
    has (a guard, not a reported limit: other sandboxes of that uid count too)."""
    refusal = landlock_refusal(uid)
    if refusal is not None:
        return refusal
    return Landlocked(f"Landlock and seccomp ({why_not_bwrap})", max_processes)


class Landlocked(Unisolated):
    """In place like `Unisolated` (host paths, one host user, no users or other layouts), but confined."""

    isolation = "landlock"
    forwards_relay = True  # only a spawned command may reach the relay (its port granted then)

    def __init__(self, detail: str, max_processes: int) -> None:
        super().__init__(detail)
        self.max_processes = max_processes

    def network(self, relay: RelayEndpoint | None) -> str:
        return "none" if relay is None else "llm"

    def users_refusal(self) -> str | None:
        return "Landlock-confined commands run as one host user"

    def fresh_home(self, box: Box) -> Path | None:
        return box.fresh_dir(_FRESH)

    def path_guard(self, source: Path, uid: int | None) -> str | None:
        # The host directory itself: every command's domain reads it and none writes it (`command`), whatever uid.
        return str(source)

    def command(
        self, box: Box, argv: Sequence[str], cwd: str, *, fresh: bool, netns: int | None, forwarder: bool = False,
        shm: Path | None = None, who: Identity = DEFAULT, status_fd: int | None = None,
    ) -> Command:
        assert box.userns is None and not box.roots  # refused at create (`layout.LocalLayout.of`)
        hosts = box.hosts
        own = [hosts["workdir"], hosts["logs"]]
        if fresh:  # its own fresh home (made just before), never the home and tmp earlier commands filled
            own += sorted(path for path in box.root.glob(f"{_FRESH}-*") if path.is_dir())
        else:
            own += [hosts["home"], hosts["tmp"]]
        # `status_fd` is bubblewrap's (`reports_start` is False here): nothing to report on.
        extra = (box.agents_source, str(box.guard_source) if box.guard_source is not None else None)
        read = (*system_paths(), *(path for path in extra if path is not None))
        ports: tuple[int, ...] = ()
        if forwarder:
            assert box.relay is not None
            ports = (_port_of(box.relay.tcp_url),)
        policy = Policy(
            read=read, write=tuple(str(path) for path in own), inet=bool(ports), connect_ports=ports,
            rlimits=dict(box.limits), cgroup_procs=box.cgroup_procs, uid=box.uid,
            nproc_over_uid=self.max_processes if box.uid is None and "nproc" not in box.limits else None,
        )
        # Spawned with the server's credentials: confine joins the groups and sets the limits before it drops to
        # the sandbox's uid (as root), so the interpreter and confine need not be readable by that uid.
        return Command(confine_argv(policy, argv), str(box.mounts.host_path(cwd)), HostCredentials())


def _port_of(url: str) -> int:
    port = urlsplit(url).port
    if port is None:
        raise ValueError(f"the relay's loopback URL names no port: {url}")
    return port
