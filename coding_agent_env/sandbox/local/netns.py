"""Empty network namespaces made by the server itself (root only), for the local backend.

A sandbox's commands all join one namespace made for that sandbox instead of each making its own: creating
and, above all, destroying a network namespace is the most expensive part of a bubblewrap spawn (the kernel
tears namespaces down in one serialised worker), so one per sandbox instead of one per command is what lets
concurrent rollouts scale. The namespace holds only a loopback interface (up, like bubblewrap's own); it is
owned by the host's initial user namespace, so sandboxed processes (no capabilities there) cannot change it.
It lives while its file descriptor is open, a process is inside it, or a socket made in it is open.

A socket made in a namespace stays in it: `begin_netns(reserve_port=PORT)` also binds a TCP socket to the new
namespace's 127.0.0.1:PORT (bound, not listening: connections are refused, and nothing else can take the
port), which the server later serves the LLM relay on while an agent runs, so the agent reaches the relay at
`http://127.0.0.1:PORT` with no forwarder process inside (serving is what makes it listen).
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
import threading
from collections.abc import Callable

__all__ = ["begin_netns", "join_path", "new_netns"]

_CLONE_NEWNET = 0x40000000
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_IFF_LOOPBACK = 0x8
_IFREQ_SIZE = 40
_LIBC = ctypes.CDLL(None, use_errno=True)


def new_netns() -> int:
    """A new network namespace with loopback up, as an O_CLOEXEC file descriptor the caller owns.
    Raises OSError when this process may not create one (no CAP_SYS_ADMIN)."""
    return begin_netns()()[0]


def begin_netns(
    reserve_port: int | None = None, on_done: Callable[[], None] | None = None
) -> Callable[[], tuple[int, socket.socket | None]]:
    """`new_netns()` in two halves, so the caller can do other work while the kernel makes the namespace:
    returns `finish`, which waits for it and returns its descriptor and, with `reserve_port`, a socket bound
    to its 127.0.0.1:`reserve_port` (or raises that OSError). Call `finish` exactly once, also when the work in
    between fails, or the descriptors leak. `on_done` is called from the maker's thread once `finish` would
    no longer wait (so an event loop can await that instead of blocking in `finish`)."""
    return _begin(reserve_port, on_done=on_done)


def _begin(
    port: int | None, *, on_done: Callable[[], None] | None = None
) -> Callable[[], tuple[int, socket.socket | None]]:
    result: list[tuple[int, socket.socket | None] | OSError] = []

    def make() -> None:
        try:
            _make(port, result)
        finally:
            if on_done is not None:
                on_done()

    # unshare() moves only the calling thread: a throwaway thread does it, so no thread of ours (and no
    # pooled executor thread) ever runs in the new namespace.
    worker = threading.Thread(target=make, name="cae-netns")
    worker.start()

    def finish() -> tuple[int, socket.socket | None]:
        worker.join()
        outcome = result[0] if result else OSError("network namespace not created")
        if isinstance(outcome, OSError):
            raise outcome
        return outcome

    return finish


def _make(port: int | None, result: list[tuple[int, socket.socket | None] | OSError]) -> None:
    if _LIBC.unshare(_CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        result.append(OSError(err, f"unshare(CLONE_NEWNET): {os.strerror(err)}"))
        return
    fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    listener = None
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            request = struct.pack("16sH", b"lo", _IFF_UP | _IFF_LOOPBACK).ljust(_IFREQ_SIZE, b"\0")
            fcntl.ioctl(sock.fileno(), _SIOCSIFFLAGS, request)
        if port is not None:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # made here: in the new namespace
            listener.bind(("127.0.0.1", port))
            listener.setblocking(False)
    except OSError as exc:
        if listener is not None:
            listener.close()
        os.close(fd)
        result.append(exc)
        return
    result.append((fd, listener))


def join_path(fd: int) -> str:
    """A path naming the namespace behind `fd` that a root helper process (nsenter) can open: the server's
    own fd stays close-on-exec, so no sandboxed process inherits it."""
    return f"/proc/{os.getpid()}/fd/{fd}"
