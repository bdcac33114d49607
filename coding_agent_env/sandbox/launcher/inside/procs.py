"""The launcher's process work: the `run`, `kill` and `killall` modes and what they share with `init` (see
`launcher.py`). Standard library only; copied into sandboxes with the launcher."""

from __future__ import annotations

import os
import resource
import time

import _signal as signal  # the C module: `signal` imports enum (see launcher.py)

_KILL_ROUNDS = 500
_KILL_WAIT_S = 10.0
_RLIMITS = {"data": resource.RLIMIT_DATA, "fsize": resource.RLIMIT_FSIZE, "cpu": resource.RLIMIT_CPU,
            "nproc": resource.RLIMIT_NPROC}


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                fields = fh.read().rpartition(b")")[2].split()
        except OSError:
            continue
        if fields and fields[0] != b"Z":
            kids.setdefault(int(fields[1]), []).append(int(name))
    return kids


def descendants(root: int) -> list[int]:
    kids, found, stack = _children_map(), [], [root]
    while stack:
        for child in kids.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def reap() -> list[tuple[int, int]]:
    reaped = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped.append((pid, status))


def _kill_tree() -> None:
    """SIGKILL every descendant of this (subreaper) process until none is left, reaping them."""
    me = os.getpid()
    for _ in range(_KILL_ROUNDS):
        alive = descendants(me)
        if not alive:
            break
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        reap()
        time.sleep(0.002)  # let the kernel deliver the kills before the next scan
    reap()


def _child_env(args: dict[str, str]) -> dict[str, str]:
    if "env-file" in args:
        import json

        with open(args["env-file"], "rb") as fh:
            env = json.load(fh)
        os.unlink(args["env-file"])
        return {str(k): str(v) for k, v in env.items()}
    keys = [k for k in args.get("env-keys", "").split(",") if k]
    return {k: os.environ[k] for k in keys if k in os.environ}


def identity(args: dict[str, str]) -> tuple[int, int, list[int]] | None:
    """(uid, gid, supplementary groups) the command runs as: `--user` (a name, or a uid, looked up in this
    sandbox's own user database: its group and supplementary groups; a uid it does not know runs with its own
    number as group and no others), else `--uid` (that uid and group, no others), else None (as this launcher:
    root). `LookupError` for a name the sandbox does not know. Root stays root, with the capabilities the
    sandbox gives its root; any other uid gets none (the kernel drops them at setuid)."""
    if "user" in args:
        import pwd  # only a run with --user needs it

        name = args["user"]
        try:
            entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
        except KeyError:
            if not name.isdigit():
                raise LookupError(f"no user {name!r} in this sandbox") from None
            return int(name), int(name), []
        return entry.pw_uid, entry.pw_gid, os.getgrouplist(entry.pw_name, entry.pw_gid)
    if "uid" in args:
        uid = int(args["uid"])
        return uid, uid, []
    return None


def _fresh_dir(args: dict[str, str], ident: tuple[int, int, list[int]] | None) -> str | None:
    base = args.get("fresh-base")
    if base is None:
        return None
    path = os.path.join(base, os.urandom(8).hex())
    os.mkdir(path, 0o700)
    if ident is not None:
        os.chown(path, ident[0], ident[1])
    return path


def default_signals() -> None:
    """Python ignores SIGPIPE and SIGXFSZ; a command must start with the default actions (as on the local
    backend: `yes | head -1` ends `yes` by SIGPIPE, a write past RLIMIT_FSIZE raises SIGXFSZ)."""
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)


def _exec_child(argv: list[str], env: dict[str, str], args: dict[str, str],
                ident: tuple[int, int, list[int]] | None, rlimits: list[str]) -> None:
    """In the forked child: never returns."""
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        default_signals()
        os.setsid()
        if "log" in args:
            fd = os.open(args["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
        for item in rlimits:
            name, _, value = item.partition("=")
            resource.setrlimit(_RLIMITS[name], (int(value), int(value)))
        if ident is not None:
            os.setgroups(ident[2])
            os.setgid(ident[1])
            os.setuid(ident[0])
        os.chdir(args.get("cwd", "/"))
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        os.write(2, f"cannot run {argv[0]!r}: {exc.strerror}\n".encode())
        os._exit(127)


def parse(argv: list[str]) -> tuple[dict[str, str], list[str], list[str]]:
    args: dict[str, str] = {}
    rlimits: list[str] = []
    i = 0
    while i < len(argv) and argv[i] != "--":
        key = argv[i].lstrip("-")
        if key == "rlimit":
            rlimits.append(argv[i + 1])
        else:
            args[key] = argv[i + 1]
        i += 2
    return args, rlimits, argv[i + 1 :]


def run(argv: list[str]) -> int:
    args, rlimits, command = parse(argv)
    try:
        ident = identity(args)
    except LookupError as exc:
        os.write(2, f"cannot run {command[0] if command else ''!r}: {exc}\n".encode())
        return 127
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD, signal.SIGTERM})
    import ctypes  # only this mode needs it

    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    env = _child_env(args)
    fresh = _fresh_dir(args, ident)
    if fresh is not None:
        env["HOME"] = env["TMPDIR"] = fresh
    pid_file = os.path.join(args["run-dir"], args["token"] + ".pid")
    with open(pid_file, "w") as fh:
        fh.write(str(os.getpid()))
    # Pid file first, kill marker second (`kill` does the reverse): a kill is never lost, even one sent
    # before this launcher started.
    if os.path.exists(os.path.join(args["run-dir"], args["token"] + ".kill")):
        status, timed_out = None, False
    else:
        child = os.fork()
        if child == 0:
            _exec_child(command, env, args, ident, rlimits)
        deadline = time.monotonic() + float(args.get("timeout", "inf"))
        status, timed_out = _wait_for(child, deadline)
    _kill_tree()
    os.unlink(pid_file)
    if fresh is not None:
        _remove_tree(fresh)
    if status is None or os.WIFSIGNALED(status):
        import json

        sig = os.WTERMSIG(status) if status is not None else signal.SIGKILL
        with open(os.path.join(args["run-dir"], args["token"] + ".status"), "w") as fh:
            json.dump({"signal": sig, "timed_out": timed_out}, fh)
        return 128 + sig
    return os.WEXITSTATUS(status)


def _wait_for(child: int, deadline: float) -> tuple[int | None, bool]:
    """(wait status of `child` or None if it was killed by us, whether the deadline passed)."""
    while True:
        for pid, status in reap():
            if pid == child:
                return status, False
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None, True
        info = signal.sigtimedwait({signal.SIGCHLD, signal.SIGTERM}, min(remaining, 3600.0))
        if info is not None and info.si_signo == signal.SIGTERM:
            return None, False


def _remove_tree(path: str) -> None:
    """Remove a fresh HOME the command may have filled with anything (a tree of any depth: `treeops`)."""
    import treeops  # beside this file (see launcher.py); only this mode needs it

    try:
        treeops.remove_tree(path)
    except OSError:
        pass  # what is left goes with the sandbox


def mark_killed(run_dir: str, token: str) -> int | None:
    """Leave the kill marker, then return the launcher's pid (None: it has not started, or is gone)."""
    with open(os.path.join(run_dir, token + ".kill"), "w"):
        pass
    try:
        with open(os.path.join(run_dir, token + ".pid")) as fh:
            return int(fh.read())
    except (OSError, ValueError):
        return None


def kill(run_dir: str, token: str) -> int:
    pid = mark_killed(run_dir, token)
    if pid is None:
        return 0
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return 0
    end = time.monotonic() + _KILL_WAIT_S
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < end:
        time.sleep(0.005)
    return 0


def killall(run_dir: str) -> int:
    for name in os.listdir(run_dir):
        if name.endswith(".pid"):
            kill(run_dir, name[: -len(".pid")])
    return 0
