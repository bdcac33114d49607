"""The launcher's `init` mode: PID 1 of a container, its control loop and the kill it handles itself (see
`launcher.py`). Standard library only; copied into sandboxes with the launcher."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

import _signal as signal  # the C modules: `signal` and `socket` import enum and re (see launcher.py)
import _socket
import procs

_FORWARDER_READY_S = 10.0
_KILL_REQUEST_S = 5.0
"""How long init waits for the host to send a kill request it announced."""
_INIT_KILL_ROUNDS = 50
"""Rounds of SIGKILL init sends through a launcher's tree itself (the launcher then finishes the job)."""

_CTL_KEY_MAX = 256
"""The most of `--ctl-key`'s file read (the host writes a short hex key)."""

Dispatch = Callable[[list[str]], int]
"""The launcher's `main`: runs one mode in this process, for requests naming the launcher itself."""


def init(argv: list[str], dispatch: Dispatch, launcher: str) -> int:
    """PID 1 (see `launcher.py`); `launcher` is the launcher's own path, whose requests `dispatch` runs."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    args, _, _ = procs.parse(argv)
    error = ""
    try:
        if "dirs" in args:
            make_dirs(args["dirs"])
        if "links" in args:
            _make_links(args["links"])
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
    return _serve(args["ctl"], _ctl_key(args.get("ctl-key")), error, dispatch, launcher)


def make_dirs(spec: str) -> None:
    """`PATH:UID:OCTAL_MODE,...` (our own paths: no `,` or `:` in them)."""
    for item in spec.split(","):
        path, uid, mode = item.split(":")
        os.makedirs(path, 0o755, exist_ok=True)
        os.chown(path, int(uid), int(uid))
        os.chmod(path, int(mode, 8))


def _make_links(spec: str) -> None:
    """`LINK=TARGET,...`: symlinks made where nothing is yet (an image's own directory there is left alone)."""
    for item in spec.split(","):
        link, target = item.split("=")
        if not os.path.lexists(link):
            os.symlink(target, link)


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


def _ctl_key(path: str | None) -> str | None:
    """The key in `--ctl-key`'s file (the host's directory: only root and the server read it), which the ready
    message carries: what tells this PID 1 from any other process that can reach the listener's path."""
    if path is None:
        return None
    try:
        with open(path, "rb") as handle:
            return handle.read(_CTL_KEY_MAX).decode("ascii", "replace")
    except OSError:
        return None


def _serve(ctl_path: str, key: str | None, error: str, dispatch: Dispatch, launcher: str) -> int:
    """The control loop of `init --ctl` (see `launcher.py`); the ready message carries `key` where there is one.
    Returns only if the host never answered."""
    import select

    conn: _socket.socket | None = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
    assert conn is not None
    try:
        conn.connect(ctl_path)
        proof = "" if key is None else ', "key": %s' % _json_text(key)
        conn.send(('{"error": %s%s}' % (_json_text(error), proof)).encode())
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
        procs.reap()
        ready, _, _ = select.select([wake_r] if conn is None else [wake_r, conn], [], [])
        if wake_r in ready:
            try:
                os.read(wake_r, 4096)
            except BlockingIOError:
                pass
        if conn is None or conn not in ready:
            continue
        try:
            msg, fds = _recv_fds(conn, 4)
        except OSError:
            msg, fds = b"", []
        if not msg:  # the host closed the control socket: only reaping is left to do
            conn.close()
            conn = None
        elif len(fds) == 3 and msg == b"k":
            _serve_kill(fds)
        elif (len(fds), msg) in ((3, b"r"), (4, b"a")):
            try:
                child = os.fork()
            except OSError:  # the pids limit is full: no reply, the host sees EOF and reports it
                child = -1
            if child == 0:
                _serve_child(fds, [conn.fileno(), wake_r, wake_w], dispatch, launcher)
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
        args, _, _ = procs.parse(request["argv"][3:])
        pid = procs.mark_killed(args["run-dir"], args["token"])
        if pid is not None:
            for _ in range(_INIT_KILL_ROUNDS):
                alive = procs.descendants(pid)
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


def _serve_child(fds: list[int], inherited: list[int], dispatch: Dispatch, launcher: str) -> None:
    """In a child of `init`: run one request (see `launcher.py`). Never returns."""
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
        stdin = fds.pop(1) if len(fds) == 4 else os.open("/dev/null", os.O_RDONLY)  # `a`: attached, its own
        for target, fd in ((0, stdin), (1, fds[1]), (2, fds[2])):
            os.dup2(fd, target)
        for fd in {stdin, fds[1], fds[2]}:
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir("/")
        if request.get("uid") is not None:
            os.setgroups([])
            os.setgid(request["uid"])
            os.setuid(request["uid"])
        code, status = _run_request(request["argv"], dispatch, launcher)
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


def _run_request(argv: list[str], dispatch: Dispatch, launcher: str) -> tuple[int, str | None]:
    """Run a request's argv in this child: a launcher mode in-process (with the status file it left, taken),
    anything else in a child of its own; (exit code, status)."""
    if argv[1:2] == [launcher]:
        code, status = dispatch(argv[2:]), None
        args, _, _ = procs.parse(argv[3:]) if argv[2] == "run" else ({}, [], [])
        path = os.path.join(args.get("run-dir", ""), args.get("token", "") + ".status")
        if "token" in args and os.path.exists(path):
            with open(path) as fh:
                status = fh.read()
            os.unlink(path)
        return code, status
    child = os.fork()
    if child == 0:
        try:
            procs.default_signals()
            os.execvpe(argv[0], argv, dict(os.environ))
        except OSError as exc:
            os.write(2, f"cannot run {argv[0]!r}: {exc.strerror}\n".encode())
        os._exit(127)
    _, wait_status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(wait_status)
    return (128 - code if code < 0 else code), None
