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
import socket
import sys
import threading

__all__ = ["listen", "main", "serve"]

_CHUNK = 64 * 1024
_BACKLOG = 64


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    """Copy until EOF or an error, then half-close the sink so the other direction can finish."""
    try:
        while data := source.recv(_CHUNK):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _handle(client: socket.socket, socket_path: str) -> None:
    relay = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        relay.connect(socket_path)
    except OSError:
        relay.close()
        client.close()
        return
    back = threading.Thread(target=_pipe, args=(relay, client), daemon=True)
    back.start()
    _pipe(client, relay)
    back.join()
    relay.close()
    client.close()


def listen(port: int) -> socket.socket:
    """A listening socket on 127.0.0.1:`port` (0 picks a free port)."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen(_BACKLOG)
    return server


def serve(server: socket.socket, socket_path: str) -> None:
    """Accept forever on `server`, piping each connection to the unix socket at `socket_path`."""
    while True:
        client, _ = server.accept()
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_handle, args=(client, socket_path), daemon=True).start()


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
