"""`python3 -I -S confine.py [OPTION VALUE]... -- ARGV...`: confine this process (options: `policy.Policy.args`),
then become ARGV. Stdlib only, run by path: the server's packages are never imported here, and what it imports
is kept cheap (it runs before every command).

In order: join the sandbox's control groups, set the rlimits (soft = hard; core dumps off; with
`--nproc-over-uid N`, RLIMIT_NPROC at N more than the tasks this uid has now: a guard where the sandbox shares
the server's uid, so a fork bomb cannot take every process the uid may have), drop to the
sandbox's uid (the server as root), restore SIGPIPE and SIGXFSZ (Python ignores them; a command must not
inherit that), set no_new_privs, enter a new Landlock domain (the policy's paths and this process's own /proc
entries: `proc_paths`), install the seccomp filter (`syscall_filter.install`), exec. Any failure exits
`CONFINE_FAILED` with one line on stderr before the command runs: never a command half-confined.
"""

from __future__ import annotations

import ctypes
import os
import resource
import sys

if __package__:
    from coding_agent_env.sandbox.landlock import ruleset, syscall_filter
else:  # run by path (`-I -S`): the siblings, and nothing else of the package
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import ruleset  # type: ignore[no-redef]
    import syscall_filter  # type: ignore[no-redef]

__all__ = ["CONFINE_FAILED", "confine", "parse", "proc_paths"]

CONFINE_FAILED = 125
"""confine's exit status when it could not confine (the command never ran); exec failures are 126/127."""
_RLIMITS = {"data": resource.RLIMIT_DATA, "fsize": resource.RLIMIT_FSIZE, "cpu": resource.RLIMIT_CPU,
            "nproc": resource.RLIMIT_NPROC, "as": resource.RLIMIT_AS, "nofile": resource.RLIMIT_NOFILE}
_LISTS = {"--read": "read", "--write": "write", "--device": "devices", "--cgroup": "cgroup_procs",
          "--connect": "connect_ports", "--rlimit": "rlimits"}
_SINGLE = {"--inet": "inet", "--uid": "uid", "--nproc-over-uid": "nproc_over_uid"}
_PR_SET_NO_NEW_PRIVS = 38
_SIGPIPE, _SIGXFSZ, _SIG_DFL = 13, 25, 0  # the same numbers on x86-64 and arm64
_PROC = "/proc"
_PROC_OTHERS = ("self", "thread-self")


def parse(args: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    """(options by name, each a list of its values; the command's argv). ValueError on anything else."""
    options: dict[str, list[str]] = {name: [] for name in (*_LISTS.values(), *_SINGLE.values())}
    index = 0
    while index < len(args) and args[index] != "--":
        flag = args[index]
        name = _LISTS.get(flag) or _SINGLE.get(flag)
        if name is None or index + 1 >= len(args):
            raise ValueError(f"unknown or incomplete option {flag[:40]!r}")
        options[name].append(args[index + 1])
        index += 2
    argv = args[index + 1:]
    if not argv:
        raise ValueError("no command after --")
    return options, argv


def proc_paths(pid: int) -> list[str]:
    """What a command may read of /proc: its own `/proc/PID` (its descendants' are other directories, not
    granted) and every entry that is no process's (cpuinfo, meminfo, sys, ...). No PID namespace here: other
    processes' directories (their command lines, the server's and other sandboxes' included) stay unreadable,
    and /proc itself unlistable."""
    names = [name for name in os.listdir(_PROC) if not name.isdigit() and name not in _PROC_OTHERS]
    return [f"{_PROC}/{pid}", *(f"{_PROC}/{name}" for name in names)]


def _tasks_of(uid: int) -> int:
    """How many tasks (threads) processes of `uid` have now: what RLIMIT_NPROC counts against."""
    count = 0
    for name in os.listdir(_PROC):
        if name.isdigit():
            try:
                if os.stat(f"{_PROC}/{name}").st_uid == uid:
                    count += len(os.listdir(f"{_PROC}/{name}/task"))
            except OSError:
                continue  # gone meanwhile
    return count


def confine(options: dict[str, list[str]]) -> None:
    """Confine the calling process (single-threaded) for good; OSError or ValueError on any failure."""
    for procs in options["cgroup_procs"]:
        with open(procs, "w") as joined:
            joined.write("0")
    for limit in options["rlimits"]:
        name, _, value = limit.partition("=")
        resource.setrlimit(_RLIMITS[name], (int(value), int(value)))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    for headroom in map(int, options["nproc_over_uid"]):
        count = _tasks_of(os.getuid()) + headroom
        resource.setrlimit(resource.RLIMIT_NPROC, (count, count))
    for uid in map(int, options["uid"]):
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    libc = ctypes.CDLL(None, use_errno=True)
    for number in (_SIGPIPE, _SIGXFSZ):
        libc.signal(number, ctypes.c_void_p(_SIG_DFL))
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "no_new_privs")
    read = [*options["read"], *proc_paths(os.getpid())]  # this pid: the command's own, once exec'd
    ports = [int(port) for port in options["connect_ports"]]
    ruleset.restrict(read, options["write"], options["devices"], ports)
    syscall_filter.install(inet=bool(options["inet"]), pid=os.getpid())


def main(args: list[str]) -> None:
    try:
        options, argv = parse(args)
        confine(options)
    except (OSError, ValueError, KeyError) as exc:
        sys.stderr.write(f"sandbox confinement failed: {exc}\n")
        sys.exit(CONFINE_FAILED)
    try:
        _exec(argv)
    except OSError as exc:
        sys.stderr.write(f"{argv[0]}: {exc.strerror}\n")
        sys.exit(127 if isinstance(exc, FileNotFoundError) else 126)


def _exec(argv: list[str]) -> None:
    """execvp's search of PATH, without its lazy imports (the interpreter's own library may be out of reach
    now); the first error other than 'not found' wins, as in the shell."""
    if "/" in argv[0]:
        os.execv(argv[0], argv)
    failure: OSError | None = None
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        try:
            os.execv(os.path.join(directory or ".", argv[0]), argv)
        except (FileNotFoundError, NotADirectoryError) as exc:
            failure = failure or exc
        except OSError as exc:
            if failure is None or isinstance(failure, (FileNotFoundError, NotADirectoryError)):
                failure = exc
    raise failure or FileNotFoundError(2, "No such file or directory")


if __name__ == "__main__":
    main(sys.argv[1:])
