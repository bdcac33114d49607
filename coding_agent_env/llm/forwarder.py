"""TCP -> unix socket forwarder, run *inside* a network-less sandbox so agents see `http://127.0.0.1:PORT/v1`.

Standard library only and importing nothing from this package: a sandbox runs it as a plain file,
`python3 -I -S forwarder.py [--detach] SOCKET_PATH PORT` (neither argument is a secret; the agent's token
travels in its own requests). It listens on 127.0.0.1:PORT and pipes every connection, both ways, to the
relay's unix socket bind-mounted at SOCKET_PATH. It runs until killed, like any process of the sandbox.

With `--detach` it binds and listens first, then forks: the parent exits 0 once the port accepts connections
(exit 1 if it cannot listen) and lets go of its stdio, so a launcher runs it in the foreground instead of polling for readiness, and
the child serves. Threads, not asyncio: it starts on every agent spawn, and importing asyncio costs more than
the whole forwarder does otherwise.
"""

from __future__ import annotations

import os
import select
import socket
import sys
import threading
import time

__all__ = ["listen", "main", "serve"]

_CHUNK = 64 * 1024
_BACKLOG = 64
MAX_CONNECTIONS = 32
"""Connections served at once (one thread each); more are closed at once. Agents keep a few open; the cap
keeps the forwarder's threads, which count against the sandbox's process limit, bounded."""
_ACCEPT_BACKOFF_S = 0.1
"""Pause after a failed accept (out of file descriptors, say), so a transient shortage is waited out."""


def _pump(client: socket.socket, relay: socket.socket) -> None:
    """Copy both ways until both sides have ended; an EOF on one side half-closes the other."""
    peers = {client.fileno(): relay, relay.fileno(): client}
    sources = {client.fileno(): client, relay.fileno(): relay}
    poller = select.poll()
    for fd in sources:
        poller.register(fd, select.POLLIN)
    open_fds = set(sources)
    while open_fds:
        for fd, _ in poller.poll():
            try:
                data = sources[fd].recv(_CHUNK)
                if data:
                    peers[fd].sendall(data)
                    continue
            except OSError:
                return  # a reset on either side ends the connection
            poller.unregister(fd)
            open_fds.discard(fd)
            try:
                peers[fd].shutdown(socket.SHUT_WR)
            except OSError:
                pass


def _handle(client: socket.socket, socket_path: str, slots: threading.BoundedSemaphore) -> None:
    try:
        with client, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as relay:
            try:
                relay.connect(socket_path)
            except OSError:
                return
            _pump(client, relay)
    finally:
        slots.release()


def listen(port: int) -> socket.socket:
    """A listening socket on 127.0.0.1:`port` (0 picks a free port)."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen(_BACKLOG)
    return server


def serve(server: socket.socket, socket_path: str) -> None:
    """Accept forever on `server`, piping each connection to the unix socket at `socket_path`. Never ends on
    a failed accept or thread start (out of descriptors or processes): that connection is dropped and the
    forwarder goes on, so a transient shortage cannot cut an agent off its LLM for the rest of the rollout."""
    slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
    while True:
        try:
            client, _ = server.accept()
        except OSError:
            time.sleep(_ACCEPT_BACKOFF_S)
            continue
        if not slots.acquire(blocking=False):
            client.close()  # over the cap: refused at once rather than queued without bound
            continue
        try:
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=_handle, args=(client, socket_path, slots), daemon=True).start()
        except (OSError, RuntimeError):
            client.close()
            slots.release()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    detach = args[:1] == ["--detach"]
    args = args[1:] if detach else args
    if len(args) != 2 or not args[1].isdigit():
        print("usage: forwarder.py [--detach] SOCKET_PATH PORT", file=sys.stderr)
        return 2
    try:
        server = listen(int(args[1]))
    except OSError as exc:
        print(f"forwarder: cannot listen on 127.0.0.1:{args[1]}: {exc.strerror}", file=sys.stderr)
        return 1
    if detach:
        if os.fork() != 0:
            return 0  # listening already: the child serves
        # Let go of the caller's pipes, so one waiting for their EOF is not held by the server.
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
    serve(server, args[0])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
