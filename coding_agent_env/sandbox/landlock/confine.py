"""`python3 -I -S confine.py POLICY -- ARGV...`: confine this process by `POLICY` (`policy.Policy` as JSON),
then become ARGV. Stdlib only, run by path: the server's packages are never imported here.

In order: join the sandbox's control groups, set the rlimits (soft = hard; core dumps off), drop to the
sandbox's uid (the server as root), restore SIGPIPE and SIGXFSZ (Python ignores them; a command must not
inherit that), set no_new_privs, enter a new Landlock domain (the policy's paths and this process's own
/proc entries, `policy.proc_paths`) (`ruleset.restrict`), install the seccomp filter
(`syscall_filter.install`: after Landlock, whose calls it would not refuse but need not see), exec. Any failure
exits `CONFINE_FAILED` with one line on stderr before the command runs: never a command half-confined.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import sys

if __package__:
    from coding_agent_env.sandbox.landlock import ruleset, syscall_filter
    from coding_agent_env.sandbox.landlock.policy import Policy, proc_paths
else:  # run by path (`-I -S`): the siblings, and nothing else of the package
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import ruleset  # type: ignore[no-redef]
    import syscall_filter  # type: ignore[no-redef]
    from policy import Policy, proc_paths  # type: ignore[no-redef]

__all__ = ["CONFINE_FAILED", "confine"]

CONFINE_FAILED = 125
"""confine's exit status when it could not confine (the command never ran); exec failures are 126/127."""
_RLIMITS = {"data": resource.RLIMIT_DATA, "fsize": resource.RLIMIT_FSIZE, "cpu": resource.RLIMIT_CPU,
            "nproc": resource.RLIMIT_NPROC, "as": resource.RLIMIT_AS, "nofile": resource.RLIMIT_NOFILE}
_PR_SET_NO_NEW_PRIVS = 38


def confine(policy: Policy) -> None:
    """Confine the calling process (single-threaded) for good; OSError on any failure."""
    for procs in policy.cgroup_procs:
        with open(procs, "w") as joined:
            joined.write("0")
    for name, value in policy.rlimits.items():
        resource.setrlimit(_RLIMITS[name], (value, value))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if policy.uid is not None:
        os.setgroups([])
        os.setresgid(policy.uid, policy.uid, policy.uid)
        os.setresuid(policy.uid, policy.uid, policy.uid)
    for number in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(number, signal.SIG_DFL)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "no_new_privs")
    read = (*policy.read, *proc_paths(os.getpid()))  # this pid: the command's own, once exec'd
    ruleset.restrict(read, policy.write, policy.devices, policy.connect_ports)
    syscall_filter.install(inet=policy.inet)


def main(args: list[str]) -> None:
    if len(args) < 3 or args[1] != "--":
        sys.stderr.write("usage: confine.py POLICY -- ARGV...\n")
        sys.exit(CONFINE_FAILED)
    try:
        confine(Policy.loads(args[0]))
    except (OSError, ValueError, TypeError, KeyError) as exc:
        sys.stderr.write(f"sandbox confinement failed: {exc}\n")
        sys.exit(CONFINE_FAILED)
    argv = args[2:]
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        sys.stderr.write(f"{argv[0]}: {exc.strerror}\n")
        sys.exit(127 if isinstance(exc, FileNotFoundError) else 126)


if __name__ == "__main__":
    main(sys.argv[1:])
