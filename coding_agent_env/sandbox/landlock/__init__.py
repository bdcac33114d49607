"""Landlock + seccomp: the isolation tier for hosts where bubblewrap cannot make namespaces (an unprivileged
container such as a Hugging Face Space), as Codex CLI's Linux sandbox does.

No privilege and no namespace: each command confines itself before it starts (`confine`, run by path with the
server's interpreter), by a `policy.Policy` the server writes: a Landlock domain (`ruleset`: read-only system
trees, read-write only the sandbox's own directories, TCP connect only to the relay's port, signals, ptrace,
`/proc/PID` secrets and abstract unix sockets kept inside the domain) and a seccomp filter (`syscall_filter`).
`probe` says whether this host can run it. The local backend runs its sandboxes this way (`local.landlocked`).
"""

from coding_agent_env.sandbox.landlock.policy import Policy, system_paths
from coding_agent_env.sandbox.landlock.probe import CONFINE, confine_argv, landlock_refusal

__all__ = ["CONFINE", "Policy", "confine_argv", "landlock_refusal", "system_paths"]
