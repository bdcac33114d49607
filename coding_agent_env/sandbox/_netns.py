"""Empty network namespaces made by the server itself (root only), for the local backend.

A sandbox's commands all join one namespace made for that sandbox instead of each making its own: creating
and, above all, destroying a network namespace is the most expensive part of a bubblewrap spawn (the kernel
tears namespaces down in one serialised worker), so one per sandbox instead of one per command is what lets
concurrent rollouts scale. The namespace holds only a loopback interface (up, like bubblewrap's own); it is
owned by the host's initial user namespace, so sandboxed processes (no capabilities there) cannot change it.
It lives while its file descriptor is open or a process is inside it.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
import threading

__all__ = ["join_path", "new_netns"]

_CLONE_NEWNET = 0x40000000
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_IFF_LOOPBACK = 0x8
_IFREQ_SIZE = 40


def new_netns() -> int:
    """A new network namespace with loopback up, as an O_CLOEXEC file descriptor the caller owns.
    Raises OSError when this process may not create one (no CAP_SYS_ADMIN)."""
    result: dict[str, int | OSError] = {}
    # unshare() moves only the calling thread: a throwaway thread does it, so no thread of ours (and no
    # pooled executor thread) ever runs in the new namespace.
    worker = threading.Thread(target=_make, args=(result,), name="cae-netns")
    worker.start()
    worker.join()
    outcome = result.get("fd")
    if isinstance(outcome, int):
        return outcome
    raise outcome if isinstance(outcome, OSError) else OSError("network namespace not created")


def _make(result: dict[str, int | OSError]) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        result["fd"] = OSError(err, f"unshare(CLONE_NEWNET): {os.strerror(err)}")
        return
    fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            request = struct.pack("16sH", b"lo", _IFF_UP | _IFF_LOOPBACK).ljust(_IFREQ_SIZE, b"\0")
            fcntl.ioctl(sock.fileno(), _SIOCSIFFLAGS, request)
    except OSError as exc:
        os.close(fd)
        result["fd"] = exc
        return
    result["fd"] = fd


def join_path(fd: int) -> str:
    """A path naming the namespace behind `fd` that a root helper process (nsenter) can open: the server's
    own fd stays close-on-exec, so no sandboxed process inherits it."""
    return f"/proc/{os.getpid()}/fd/{fd}"
