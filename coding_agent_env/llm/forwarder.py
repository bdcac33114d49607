"""TCP -> unix socket forwarder, run *inside* a network-less sandbox so agents see `http://127.0.0.1:PORT/v1`.

Standard library only and importing nothing from this package: a sandbox runs it as a plain file,
`python3 forwarder.py SOCKET_PATH PORT` (neither argument is a secret; the agent's token travels in its own
requests). It listens on 127.0.0.1:PORT and pipes every connection, both ways, to the relay's unix socket
bind-mounted at SOCKET_PATH. It runs until killed, like any process of the sandbox.
"""

from __future__ import annotations

import asyncio
import sys

__all__ = ["forward", "main"]

_CHUNK = 64 * 1024


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def forward(socket_path: str, port: int, ready: asyncio.Event | None = None) -> None:
    """Serve 127.0.0.1:`port` forever, piping each connection to the unix socket at `socket_path`."""

    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            relay_reader, relay_writer = await asyncio.open_unix_connection(socket_path)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(_pipe(client_reader, relay_writer), _pipe(relay_reader, client_writer))

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    if ready is not None:
        ready.set()
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or not args[1].isdigit():
        print("usage: forwarder.py SOCKET_PATH PORT", file=sys.stderr)
        return 2
    asyncio.run(forward(args[0], int(args[1])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
