"""The control transport: commands sent to the container's PID 1 over a socket, no engine exec per command.

For a daemon on this host (a `unix://` DOCKER_HOST, the usual case, and the one network `llm` needs anyway).
A per-container host directory (`HostDir`) holding the launcher, the forwarder and a one-shot SOCK_SEQPACKET
listener is bind-mounted read-only; the container's PID 1 (`launcher.py init --ctl`) makes the sandbox
directories, starts the forwarder under `llm`, then connects to that listener (the connection is the readiness
signal, once its ready message carries the key only root and the server can read, `HostDir.KEY`: another process
of this host that reaches the listener's path, a Landlock-tier sandbox of the server's uid, is closed unheard;
the listener is then closed and unlinked, before any sandbox command exists). Each command is a
message on that connection carrying three socket fds (request/reply, stdout, stderr): PID 1 forks, no new
interpreter. Sends are serialised and bounded (`CtlSender`). A kill is handled by PID 1 itself, without
forking, so an agent that fills the pids limit can still be killed; a command PID 1 could not fork for gets no
reply and ends with exit code `NO_REPLY_CODE` and a note on stderr. A malformed reply (the image, and so the
python3 that runs PID 1, is the caller's) is a `SandboxError`.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from coding_agent_env.errors import SandboxError
from coding_agent_env.sandbox.docker.engine import call
from coding_agent_env.sandbox.docker.hostdir import HostDir
from coding_agent_env.sandbox.docker.layout import GUARD_DIR, LAYOUT, RELAY_SOCKET, SandboxLayout
from coding_agent_env.sandbox.docker.reaper import LABEL_HOSTDIR
from coding_agent_env.sandbox.docker.transport import ContainerSpec, DockerTransport
from coding_agent_env.sandbox.launcher.client import OutputCap
from coding_agent_env.sandbox.launcher.transport import Ran

__all__ = ["NO_REPLY_CODE", "ControlChannel", "CtlSender", "parse_hello", "parse_reply"]

log = logging.getLogger(__name__)

NO_REPLY_CODE = 126
"""Exit code of a command PID 1 never answered for: it could not fork (the pids limit is full) or the
command's runner died; stderr says so."""
SEND_S = 30.0
"""How long a control message may wait for room in PID 1's queue."""
_INIT_READY_S = 30.0
"""How long PID 1 may take to report ready (directories, forwarder) before create fails."""
_HELLO_S = 5.0
"""How long a connection to the listener may take to say its ready message (PID 1 sends it as it connects)."""


class ControlChannel(DockerTransport):
    """Commands through PID 1's control socket: `prepare(state_dir)` before the container exists, connected
    by `boot`; or `over(sock)`, a socket already connected to a PID 1."""

    name = "control"
    brings_status = True

    def __init__(self, host: HostDir | None = None, sock: socket.socket | None = None) -> None:
        self._host = host
        self._sender = CtlSender(sock) if sock is not None else None

    @classmethod
    def prepare(cls, state_dir: Path) -> ControlChannel:
        """A channel with its host directory made and listening; `SandboxError` if it cannot be."""
        return cls(host=HostDir.make(state_dir))

    @classmethod
    def over(cls, sock: socket.socket) -> ControlChannel:
        """A channel on `sock` (non-blocking, SOCK_SEQPACKET), connected to a PID 1 that said it is ready."""
        return cls(sock=sock)

    def container_spec(self, forward_port: int | None, layout: SandboxLayout) -> ContainerSpec:
        assert self._host is not None
        # -I -S: PID 1's start-up is on every create's path; it needs neither site nor PYTHON* variables.
        command = [LAYOUT.python, "-I", "-S", LAYOUT.launcher, "init", "--dirs", layout.dirs()]
        links = layout.links_arg()
        if links is not None:
            command += ["--links", links]
        command += ["--ctl", f"{LAYOUT.code_dir}/{HostDir.SOCKET}", "--ctl-key", f"{LAYOUT.code_dir}/{HostDir.KEY}"]
        if forward_port is not None:
            command += ["--forward-socket", RELAY_SOCKET, "--forward-port", str(forward_port)]
        # Read-only mounts: the code, and the control listener (connecting needs no writable mount); the path
        # guard on its own (the code's directory is root's alone).
        volumes = {str(self._host.path): {"bind": LAYOUT.code_dir, "mode": "ro"},
                   str(self._host.guard): {"bind": GUARD_DIR, "mode": "ro"}}
        return ContainerSpec(command, volumes, {LABEL_HOSTDIR: str(self._host.path)})

    async def boot(self, api: Any, container_id: str, forward_port: int | None) -> None:
        await call("start container", api.start, container_id)
        conn, hello = await self._accept(api, container_id)
        self._sender = CtlSender(conn)
        error = parse_hello(hello)
        if error:
            raise SandboxError(f"the container's init failed: {error}")

    async def _accept(self, api: Any, container_id: str) -> tuple[socket.socket, bytes]:
        """PID 1's connection to the listener and its ready message: the first connection whose message proves the
        host directory's key (`HostDir.proves`); any other (a process of this host that reached the listener's
        path) is closed unheard. The listener is closed once this returns or fails."""
        assert self._host is not None
        loop = asyncio.get_running_loop()
        end = loop.time() + _INIT_READY_S
        try:
            while True:
                conn = await self._connection(api, container_id, end)
                conn.setblocking(False)
                try:
                    hello = await asyncio.wait_for(loop.sock_recv(conn, 4096), _HELLO_S)
                except (TimeoutError, OSError):
                    hello = b""
                except BaseException:
                    conn.close()
                    raise
                if self._host.proves(hello):
                    return conn, hello
                conn.close()
                log.warning("container %s: a connection to its control listener without its key, closed",
                            container_id[:12])
                if loop.time() > end:
                    raise SandboxError(f"the container's init is not ready after {_INIT_READY_S:.0f} s (only "
                                       "connections without its key reached the control listener)")
        finally:
            self._host.close_listener()

    async def _connection(self, api: Any, container_id: str, end: float) -> socket.socket:
        """The next connection to the listener, by `end` (checking now and then that the container still runs)."""
        assert self._host is not None and self._host.listener is not None
        loop = asyncio.get_running_loop()
        accept = asyncio.ensure_future(loop.sock_accept(self._host.listener))
        try:
            while True:
                done, _ = await asyncio.wait([accept], timeout=0.5)
                if done:
                    break
                state = (await call("inspect container", api.inspect_container, container_id))["State"]
                if not state.get("Running") or loop.time() > end:
                    logs = await call("container logs", api.logs, container_id, tail=20)
                    why = "exited" if not state.get("Running") else f"is not ready after {_INIT_READY_S:.0f} s"
                    raise SandboxError(f"the container's init {why}: {logs.decode(errors='replace')[-500:]}")
        except BaseException:
            # Cancelled (or failed) just as PID 1 connected: that connection is nobody's but ours to close.
            if accept.done() and not accept.cancelled() and accept.exception() is None:
                accept.result()[0].close()
            raise
        finally:
            if not accept.done():
                accept.cancel()
        conn, _ = accept.result()
        return conn

    async def run(self, argv: Sequence[str], *, env: Mapping[str, str], uid: int | None, out: OutputCap,
                  err: OutputCap, timeout: float | None = None, kill: bool = False) -> Ran:
        if self._sender is None:
            raise SandboxError("the container's init is not connected")
        loop = asyncio.get_running_loop()
        pairs = [socket.socketpair() for _ in range(3)]
        try:
            try:
                await self._sender.send(b"k" if kill else b"r", [theirs.fileno() for _, theirs in pairs])
            except OSError:
                return Ran(None)  # PID 1 is gone: the container was removed
            finally:
                for _, theirs in pairs:
                    theirs.close()
            chan, out_sock, err_sock = (ours for ours, _ in pairs)
            for sock in (chan, out_sock, err_sock):
                sock.setblocking(False)
            request = json.dumps({"argv": list(argv), "env": dict(env), "uid": uid}).encode()
            try:
                await loop.sock_sendall(chan, request)
                chan.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # the child died before reading: reported below as no reply
            await asyncio.gather(_pump(loop, out_sock, out), _pump(loop, err_sock, err))
            reply = OutputCap(64 * 1024)
            await _pump(loop, chan, reply)
        finally:
            for ours, _ in pairs:
                ours.close()
        if not reply.kept:
            if self._sender.closed:
                return Ran(None)
            # PID 1 could not fork (pids limit full) or the runner died: the command did not run to its end.
            err.add(b"\nsandbox: no reply from the container's init (no process could be started, or the "
                    b"command's runner died)\n")
            return Ran(NO_REPLY_CODE)
        code, status = parse_reply(bytes(reply.kept))
        return Ran(code, status.encode() if status is not None else None)

    async def attach(self, argv: Sequence[str], *, env: Mapping[str, str],
                     uid: int | None) -> tuple[asyncio.Future[Ran], socket.socket, socket.socket]:
        """Start argv with a socket to its stdin and one from its stdout and stderr (control message `a`):
        (its end, the stdin socket, the output socket). The sockets are the caller's to close."""
        if self._sender is None:
            raise SandboxError("the container's init is not connected")
        loop = asyncio.get_running_loop()
        chan, stdin, output = (socket.socketpair() for _ in range(3))
        try:
            await self._sender.send(b"a", [chan[1].fileno(), stdin[1].fileno(), output[1].fileno(),
                                           output[1].fileno()])
            chan[0].setblocking(False)
            await loop.sock_sendall(chan[0], json.dumps({"argv": list(argv), "env": dict(env),
                                                         "uid": uid}).encode())
            chan[0].shutdown(socket.SHUT_WR)
        except BaseException as exc:  # cancelled or timed out too: no end of ours outlives the attach
            for ours, _ in (chan, stdin, output):
                ours.close()
            if isinstance(exc, OSError):
                raise SandboxError(f"cannot attach in the container: {exc}") from exc
            raise
        finally:
            for _, theirs in (chan, stdin, output):
                theirs.close()

        async def ended() -> Ran:
            reply = OutputCap(64 * 1024)
            try:
                await _pump(loop, chan[0], reply)
            finally:
                chan[0].close()
            if not reply.kept:
                return Ran(None if self._sender is None or self._sender.closed else NO_REPLY_CODE)
            code, status = parse_reply(bytes(reply.kept))
            return Ran(code, status.encode() if status is not None else None)

        return asyncio.ensure_future(ended()), stdin[0], output[0]

    async def read_file(self, path: str) -> bytes:
        raise SandboxError("the control transport brings launcher statuses with its replies")

    async def close(self) -> None:
        if self._sender is not None:
            self._sender.close()
        if self._host is not None:
            self._host.remove()


class CtlSender:
    """Sends control messages on PID 1's socket, one at a time (an asyncio.Lock: a socket has one writer
    callback in the loop, so two waiting senders would lose one wake-up), each within `SEND_S`. `close()`
    during a send wakes it with an OSError (read as "PID 1 is gone")."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.closed = False
        self._lock = asyncio.Lock()
        self._waiter: asyncio.Future[None] | None = None

    async def send(self, msg: bytes, fds: list[int], timeout: float = SEND_S) -> None:
        """One message carrying `fds` (SOCK_SEQPACKET: atomic). OSError: closed; SandboxError: timed out."""
        try:
            async with asyncio.timeout(timeout):
                async with self._lock:
                    await self._send(msg, fds)
        except TimeoutError:
            raise SandboxError(f"the container's init took no command for {timeout:.0f} s") from None

    async def _send(self, msg: bytes, fds: list[int]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self.closed:
                raise OSError(errno.EBADF, "the control socket is closed")
            try:
                socket.send_fds(self.sock, [msg], fds)
                return
            except BlockingIOError:
                pass
            waiter = self._waiter = loop.create_future()
            loop.add_writer(self.sock, lambda: waiter.done() or waiter.set_result(None))
            try:
                await waiter
            finally:
                self._waiter = None
                if not self.closed:
                    loop.remove_writer(self.sock)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        waiter = self._waiter
        if waiter is not None:
            waiter.get_loop().remove_writer(self.sock)
            if not waiter.done():
                waiter.set_result(None)
        self.sock.close()


def parse_reply(raw: bytes) -> tuple[int, str | None]:
    """PID 1's reply `{"code": int, "status": str|null}`; SandboxError on any other shape (the image, so its
    python3 that runs PID 1, is the caller's)."""
    try:
        answer = json.loads(raw)
    except ValueError:
        answer = None
    if isinstance(answer, dict):
        code, status = answer.get("code"), answer.get("status")
        if type(code) is int and (status is None or isinstance(status, str)):
            return code, status
    raise SandboxError(f"malformed reply from the container's init: {raw[:100]!r}")


def parse_hello(raw: bytes) -> str:
    """PID 1's ready message `{"error": str}` ("" when ready); a malformed one is an error message."""
    if not raw:
        return "init closed the control socket"
    try:
        hello = json.loads(raw)
    except ValueError:
        hello = None
    if isinstance(hello, dict) and isinstance(hello.get("error"), str):
        return str(hello["error"])
    return f"malformed ready message {raw[:100]!r}"


async def _pump(loop: asyncio.AbstractEventLoop, sock: socket.socket, cap: OutputCap) -> None:
    """Read `sock` to EOF into `cap` (a reset counts as EOF: the container went away)."""
    try:
        while chunk := await loop.sock_recv(sock, 64 * 1024):
            cap.add(chunk)
    except OSError:
        pass
