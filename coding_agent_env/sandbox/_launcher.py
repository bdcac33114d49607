"""In-sandbox process launcher for backends whose engine runs commands for us (docker, hf, e2b).

Standard library only and importing nothing from this package: backends copy this file into the sandbox and
run it as `python3 launcher.py MODE ...`. Modes:

- `run --token T --run-dir D [--timeout S] [--cwd C] [--uid U] [--env-keys K1,K2 | --env-file F]
  [--fresh-base B] [--rlimit NAME=V ...] [--log F] -- ARGV...`: becomes a child subreaper (so nothing the
  command forks can escape to PID 1, not even through `setsid`), starts ARGV in its own session with exactly
  the given environment (from the listed variables of its own environment, or from a JSON file it deletes
  after reading), waits up to the timeout, then SIGKILLs every descendant still alive. It exits with the
  command's code; when the command died of a signal or timed out it exits 128+signal and leaves
  `D/T.status` (JSON `{"signal": N, "timed_out": bool}`) for the backend to read. SIGTERM to the launcher
  kills the tree the same way. Its pid is kept in `D/T.pid` while it runs.
- `kill --token T --run-dir D`: SIGTERM that launcher and wait (bounded) until it is gone; a launcher
  that has not started yet exits as soon as it does.
- `killall --run-dir D`: the same for every launcher that has a pid file in D.
- `init [--dirs SPEC] [--forward-socket SOCKET --forward-port PORT] [--ctl SOCKET]`: a PID 1 for
  containers. It reaps zombies. With `--dirs` (`PATH:UID:OCTAL_MODE,...`) it first makes those
  directories (parents root-owned 0755) and sets their owner and mode. With `--forward-*` it starts the LLM
  forwarder (as root, `python3 -I -S forwarder.py --detach`) on 127.0.0.1:PORT piping to SOCKET and waits
  (bounded) for its exit code (0: it listens). With `--ctl`
  it then connects to the host's SOCK_SEQPACKET control socket and sends one JSON `{"error": str}` (""
  when ready). After that, each control message carries three fds (request/reply socket, stdout, stderr):
  init forks a child (a fork that fails -- the pids limit is full -- leaves the request without a reply:
  its fds are closed and init keeps serving) that reads the request JSON `{"argv", "env", "uid"}` until
  EOF, runs it with exactly that environment, stdin /dev/null, stdout/stderr on the two fds and cwd `/`
  (launcher modes in-process, anything else in a child it waits for, as `uid` when given), then writes
  the reply JSON
  `{"code": int, "status": str|null}` (`status`: the run's status file, when a `run` left one). Commands
  thus start without the engine's exec API. A message `k` (rather than `r`) is a `kill` request, which init
  handles itself without forking (`_serve_kill`), so an agent that fills the pids limit can still be
  killed. Commands start with SIGPIPE and SIGXFSZ at their default actions (Python ignores both). A closed
  control socket leaves init a plain reaper.
- `list PATH MAX`: JSON listing of a tree without following symlinks (one object on stdout).
- `stat PATH`: JSON `{"real": realpath, "kind": ...}` of PATH (missing: `{"real": null}`).
- `remove PATH ROOT`: remove PATH below ROOT without following any symlink, ROOT's own path excepted
  (missing: not an error).
- `prepare PATH ROOT [--uid U]`: make PATH's parents below ROOT real directories (owned by U), unlink a
  symlink at PATH.
"""

from __future__ import annotations

import os
import resource
import stat
import sys
import time

# The C modules, not `signal`/`socket`/`json`: those import enum and re, ~20 ms more on every container's
# start (init's) under load. `json` is imported where it is used (and preloaded by init once it is ready).
import _signal as signal
import _socket

_KILL_ROUNDS = 500
_KILL_WAIT_S = 10.0
_FORWARDER_READY_S = 10.0
_KILL_REQUEST_S = 5.0
"""How long init waits for the host to send a kill request it announced."""
_INIT_KILL_ROUNDS = 50
"""Rounds of SIGKILL init sends through a launcher's tree itself (the launcher then finishes the job)."""
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


def _descendants(root: int) -> list[int]:
    kids, found, stack = _children_map(), [], [root]
    while stack:
        for child in kids.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def _reap() -> list[tuple[int, int]]:
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
        alive = _descendants(me)
        if not alive:
            break
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _reap()
        time.sleep(0.002)  # let the kernel deliver the kills before the next scan
    _reap()


def _child_env(args: dict[str, str]) -> dict[str, str]:
    if "env-file" in args:
        import json

        with open(args["env-file"], "rb") as fh:
            env = json.load(fh)
        os.unlink(args["env-file"])
        return {str(k): str(v) for k, v in env.items()}
    keys = [k for k in args.get("env-keys", "").split(",") if k]
    return {k: os.environ[k] for k in keys if k in os.environ}


def _fresh_dir(args: dict[str, str], uid: int | None) -> str | None:
    base = args.get("fresh-base")
    if base is None:
        return None
    path = os.path.join(base, os.urandom(8).hex())
    os.mkdir(path, 0o700)
    if uid is not None:
        os.chown(path, uid, uid)
    return path


def _default_signals() -> None:
    """Python ignores SIGPIPE and SIGXFSZ; a command must start with the default actions (as on the local
    backend: `yes | head -1` ends `yes` by SIGPIPE, a write past RLIMIT_FSIZE raises SIGXFSZ)."""
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)


def _exec_child(argv: list[str], env: dict[str, str], args: dict[str, str], uid: int | None, rlimits: list[str]) -> None:
    """In the forked child: never returns."""
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        _default_signals()
        os.setsid()
        if "log" in args:
            fd = os.open(args["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
        for item in rlimits:
            name, _, value = item.partition("=")
            resource.setrlimit(_RLIMITS[name], (int(value), int(value)))
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        os.chdir(args.get("cwd", "/"))
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        os.write(2, f"cannot run {argv[0]!r}: {exc.strerror}\n".encode())
        os._exit(127)


def _parse(argv: list[str]) -> tuple[dict[str, str], list[str], list[str]]:
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
    args, rlimits, command = _parse(argv)
    uid = int(args["uid"]) if "uid" in args else None
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD, signal.SIGTERM})
    import ctypes  # only this mode needs it

    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    env = _child_env(args)
    fresh = _fresh_dir(args, uid)
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
            _exec_child(command, env, args, uid, rlimits)
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
        for pid, status in _reap():
            if pid == child:
                return status, False
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None, True
        info = signal.sigtimedwait({signal.SIGCHLD, signal.SIGTERM}, min(remaining, 3600.0))
        if info is not None and info.si_signo == signal.SIGTERM:
            return None, False


def _remove_tree(path: str) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _mark_killed(run_dir: str, token: str) -> int | None:
    """Leave the kill marker, then return the launcher's pid (None: it has not started, or is gone)."""
    with open(os.path.join(run_dir, token + ".kill"), "w"):
        pass
    try:
        with open(os.path.join(run_dir, token + ".pid")) as fh:
            return int(fh.read())
    except (OSError, ValueError):
        return None


def kill(run_dir: str, token: str) -> int:
    pid = _mark_killed(run_dir, token)
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


def init(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    args, _, _ = _parse(argv)
    error = ""
    try:
        if "dirs" in args:
            _make_dirs(args["dirs"])
        if "forward-socket" in args:
            error = _start_forwarder(args["forward-socket"], args["forward-port"])
    except OSError as exc:
        error = f"init: {exc}"
    if "ctl" not in args:
        while True:
            try:
                os.wait()
            except ChildProcessError:
                signal.pause()
    return _serve(args["ctl"], error)


def _make_dirs(spec: str) -> None:
    """`PATH:UID:OCTAL_MODE,...` (our own paths: no `,` or `:` in them)."""
    for item in spec.split(","):
        path, uid, mode = item.split(":")
        os.makedirs(path, 0o755, exist_ok=True)
        os.chown(path, int(uid), int(uid))
        os.chmod(path, int(mode, 8))


def _json_text(text: str) -> str:
    """A JSON string literal, without importing json."""
    return '"' + "".join(c if c.isprintable() and c not in '"\\' else "\\u%04x" % min(ord(c), 0xFFFD)
                         for c in text) + '"'


def _recv_fds(sock: _socket.socket, maxfds: int) -> tuple[bytes, list[int]]:
    """`socket.recv_fds` on a plain `_socket.socket`."""
    import array

    fds = array.array("i")
    msg, ancdata, _, _ = sock.recvmsg(16, _socket.CMSG_LEN(maxfds * fds.itemsize))
    for level, kind, data in ancdata:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    return msg, list(fds)


def _start_forwarder(socket_path: str, port: str) -> str:
    """Start the forwarder next to this file (`-I -S`, `--detach`: it returns once 127.0.0.1:PORT listens,
    exit 1 if it cannot); "" once it listens, else why not. Its server process is left to init to reap."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "forwarder.py")
    child = os.fork()
    if child == 0:
        try:
            os.setsid()
            os.execv(sys.executable, [sys.executable, "-I", "-S", script, "--detach", socket_path, port])
        finally:
            os._exit(127)
    end = time.monotonic() + _FORWARDER_READY_S
    while True:
        pid, status = os.waitpid(child, os.WNOHANG)
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            return "" if code == 0 else f"the LLM forwarder did not start (exit {code})"
        if time.monotonic() > end:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            return f"the LLM forwarder did not listen on port {port} within {_FORWARDER_READY_S:.0f} s"
        time.sleep(0.002)  # bounded: the forwarder's start-up (python, listen) is a few ms


def _serve(ctl_path: str, error: str) -> int:
    """The control loop of `init --ctl` (see the module docstring). Returns only if the host never answered."""
    import select

    conn: _socket.socket | None = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
    assert conn is not None
    try:
        conn.connect(ctl_path)
        conn.send(('{"error": %s}' % _json_text(error)).encode())
    except OSError:
        conn.close()
        conn = None
    # Imported once, after the ready message, so that forked requests need not.
    import ctypes  # noqa: F401
    import json  # noqa: F401
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so SIGCHLD wakes the select (wakeup fd)
    while True:
        _reap()
        ready, _, _ = select.select([wake_r] if conn is None else [wake_r, conn], [], [])
        if wake_r in ready:
            try:
                os.read(wake_r, 4096)
            except BlockingIOError:
                pass
        if conn is None or conn not in ready:
            continue
        try:
            msg, fds = _recv_fds(conn, 3)
        except OSError:
            msg, fds = b"", []
        if not msg:  # the host closed the control socket: only reaping is left to do
            conn.close()
            conn = None
        elif len(fds) == 3 and msg == b"k":
            _serve_kill(fds)
        elif len(fds) == 3:
            try:
                child = os.fork()
            except OSError:  # the pids limit is full: no reply, the host sees EOF and reports it
                child = -1
            if child == 0:
                _serve_child(fds, [conn.fileno(), wake_r, wake_w])
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass


def _serve_kill(fds: list[int]) -> None:
    """A `kill` request (control message `k`), run inside init itself: it must work when no process can be
    forked (an agent filled the pids limit). Reads the request (bounded), SIGKILLs the launcher's tree and
    SIGTERMs the launcher (which then reaps, writes its status and replies to its own request), and replies
    `{"code": 0, "status": null}` without waiting. Closes nothing: the caller closes `fds`."""
    import json

    chan = _socket.socket(fileno=os.dup(fds[0]))
    code = 1
    try:
        chan.settimeout(_KILL_REQUEST_S)
        chunks, size = [], 0
        while size <= 65536 and (data := chan.recv(65536)):
            chunks.append(data)
            size += len(data)
        request = json.loads(b"".join(chunks))
        args, _, _ = _parse(request["argv"][3:])
        pid = _mark_killed(args["run-dir"], args["token"])
        if pid is not None:
            for _ in range(_INIT_KILL_ROUNDS):
                alive = _descendants(pid)
                for target in alive:
                    try:
                        os.kill(target, signal.SIGKILL)
                    except OSError:
                        pass
                if not alive:
                    break
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:
                pass
        code = 0
    except Exception as exc:  # a bad request: reply with the failure, keep serving
        try:
            os.write(fds[2], f"launcher: kill: {type(exc).__name__}: {exc}\n".encode())
        except OSError:
            pass
    try:
        chan.setblocking(False)
        chan.send(('{"code": %d, "status": null}' % code).encode())
    except OSError:
        pass
    finally:
        chan.close()


def _serve_child(fds: list[int], inherited: list[int]) -> None:
    """In a child of `init`: run one request (see the module docstring). Never returns."""
    import json

    code, status = 1, None
    try:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        for fd in inherited:
            os.close(fd)
        os.set_inheritable(fds[0], False)  # received fds may lack close-on-exec: no command may hold the reply
        chan = _socket.socket(fileno=fds[0])
        chunks = []
        while data := chan.recv(65536):
            chunks.append(data)
        request = json.loads(b"".join(chunks))
        null = os.open("/dev/null", os.O_RDONLY)
        for target, fd in ((0, null), (1, fds[1]), (2, fds[2])):
            os.dup2(fd, target)
        for fd in (null, fds[1], fds[2]):
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir("/")
        argv = request["argv"]
        if request.get("uid") is not None:
            os.setgroups([])
            os.setgid(request["uid"])
            os.setuid(request["uid"])
        if argv[1:2] == [os.path.abspath(__file__)]:
            code = main(argv[2:])
            args, _, _ = _parse(argv[3:]) if argv[2] == "run" else ({}, [], [])
            path = os.path.join(args.get("run-dir", ""), args.get("token", "") + ".status")
            if "token" in args and os.path.exists(path):
                with open(path) as fh:
                    status = fh.read()
                os.unlink(path)
        else:
            child = os.fork()
            if child == 0:
                try:
                    _default_signals()
                    os.execvpe(argv[0], argv, dict(os.environ))
                except OSError as exc:
                    os.write(2, f"cannot run {argv[0]!r}: {exc.strerror}\n".encode())
                os._exit(127)
            _, wait_status = os.waitpid(child, 0)
            code = os.waitstatus_to_exitcode(wait_status)
            code = 128 - code if code < 0 else code
    except BaseException as exc:  # anything: the host must still get a reply
        try:
            os.write(2, f"launcher: {type(exc).__name__}: {exc}\n".encode())
        except OSError:
            pass
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:
        pass
    try:
        chan.sendall(json.dumps({"code": code, "status": status}).encode())
    except (OSError, NameError):
        pass
    os._exit(0)


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISDIR(mode):
        return "dir"
    return "file" if stat.S_ISREG(mode) else "other"


def listing(top: str, max_entries: int) -> int:
    import json

    entries: list[list[object]] = []
    stack, cut = [""], False
    while stack and not cut:
        rel_dir = stack.pop()
        try:
            names = sorted(os.listdir(os.path.join(top, rel_dir) if rel_dir else top))
        except OSError:
            continue
        subdirs = []
        for name in names:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            if len(entries) >= max_entries:
                cut = True
                break
            st = os.lstat(os.path.join(top, rel))
            kind = _kind(st.st_mode)
            entries.append([rel, kind, st.st_size if kind == "file" else 0])
            if kind == "dir":
                subdirs.append(rel)
        stack.extend(reversed(subdirs))
    json.dump({"entries": entries, "cut": cut}, sys.stdout)
    return 0


def stat_path(path: str) -> int:
    import json

    if not os.path.lexists(path):
        json.dump({"real": None}, sys.stdout)
        return 0
    real = os.path.realpath(path)
    kind = _kind(os.lstat(real).st_mode) if os.path.lexists(real) else "missing"
    json.dump({"real": real, "kind": kind}, sys.stdout)
    return 0


def read_slice(path: str, max_bytes: int, end: str) -> int:
    """Print, base64-encoded, at most `max_bytes` of the regular file `path`: its head, or its tail with
    `end` "tail". The caller resolved `path`; a symlink put in its place since is not followed."""
    import base64

    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            print(f"not a regular file: {path}", file=sys.stderr)
            return 1
        if end == "tail":
            handle.seek(max(os.fstat(fd).st_size - max_bytes, 0))
        data = handle.read(max_bytes)
    sys.stdout.write(base64.b64encode(data).decode("ascii"))
    return 0


def prepare(path: str, root: str, uid: int | None) -> int:
    """Make every directory between `root` and PATH's parent real (a symlink or file there is replaced,
    never followed), then remove a symlink at PATH itself."""
    rel = os.path.relpath(os.path.dirname(path), root)
    current = root
    for part in [] if rel == "." else rel.split("/"):
        current = os.path.join(current, part)
        if os.path.islink(current) or (os.path.lexists(current) and not os.path.isdir(current)):
            os.unlink(current)
        if not os.path.lexists(current):
            os.mkdir(current, 0o755)
            if uid is not None:
                os.chown(current, uid, uid)
    if os.path.islink(path):
        os.unlink(path)
    return 0


def remove(path: str, root: str) -> int:
    """Remove PATH (a tree, a file or a symlink, never followed) below ROOT, as whoever runs this (root: an
    agent's mode-000 directories are no obstacle). Every directory from ROOT down to PATH's parent is opened
    with O_NOFOLLOW, so a symlink the sandbox user planted there fails the removal instead of redirecting it;
    `rm -rf` (which follows no symlink) then runs in that parent, pinned as its cwd. Missing: not an error."""
    rel = os.path.relpath(path, root)
    if rel == "." or rel.startswith("..") or os.path.isabs(rel):
        print(f"refusing to remove {path!r}", file=sys.stderr)
        return 2
    *parents, name = rel.split("/")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parents:
            try:
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except FileNotFoundError:
                return 0
            except OSError as exc:
                print(f"cannot remove {path!r}: {part!r} is not a real directory ({exc.strerror})", file=sys.stderr)
                return 1
            os.close(fd)
            fd = nxt
        child = os.fork()
        if child == 0:
            try:
                os.fchdir(fd)
                _default_signals()
                os.execvp("rm", ["rm", "-rf", "--", name])
            finally:
                os._exit(127)
    finally:
        os.close(fd)
    _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


def main(argv: list[str]) -> int:
    mode, rest = argv[0], argv[1:]
    if mode == "run":
        return run(rest)
    if mode == "kill":
        args, _, _ = _parse(rest)
        return kill(args["run-dir"], args["token"])
    if mode == "killall":
        args, _, _ = _parse(rest)
        return killall(args["run-dir"])
    if mode == "init":
        return init(rest)
    if mode == "list":
        return listing(rest[0], int(rest[1]))
    if mode == "stat":
        return stat_path(rest[0])
    if mode == "remove":
        return remove(rest[0], rest[1])
    if mode == "read":
        return read_slice(rest[0], int(rest[1]), rest[2])
    if mode == "prepare":
        args, _, _ = _parse(rest[2:])
        return prepare(rest[0], rest[1], int(args["uid"]) if "uid" in args else None)
    print(f"unknown mode {mode!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
