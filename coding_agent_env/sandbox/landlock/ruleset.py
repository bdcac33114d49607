"""Landlock through its three system calls (ctypes, stdlib only: `confine` imports it as a plain file).

A Landlock domain is made by a process for itself and everything it starts after; it cannot be left or
widened. What this module handles (`restrict`): every filesystem right the running kernel knows, outside the
paths granted read-only or read-write (and a few device files); TCP bind and connect, outside the ports granted
(ABI >= 4); signals and abstract unix sockets to anything outside the domain (ABI >= 6). The kernel also denies
a domain's processes ptrace and `/proc/PID/{environ,mem,...}` of the processes of their uid outside it.
"""

from __future__ import annotations

import ctypes
import os
import stat

__all__ = ["MIN_ABI", "LandlockError", "abi", "restrict"]

MIN_ABI = 6
"""The oldest ABI that can keep the tier's promises: TCP port rules (4), signal and abstract-socket scoping (6)."""

_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446  # the same number on every architecture
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH, _RULE_NET_PORT = 1, 2

# Filesystem rights (landlock.h), by the ABI that introduced them.
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_TRUNCATE, FS_IOCTL_DEV = 1 << 14, 1 << 15
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
_FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
"""The rights a rule on a non-directory may carry (the kernel refuses the others there)."""
READ_ONLY = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
DEVICE = FS_READ_FILE | FS_WRITE_FILE | FS_TRUNCATE | FS_IOCTL_DEV
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1


class LandlockError(OSError):
    """Landlock is missing, too old, or refused a step."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1  # packed in landlock.h
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _NetPort(ctypes.Structure):
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _call(what: str, number: int, *args: object) -> int:
    result = _libc.syscall(number, *args)
    if result < 0:
        errno = ctypes.get_errno()
        raise LandlockError(errno, f"{what}: {os.strerror(errno)}")
    return int(result)


def abi() -> int:
    """The kernel's Landlock ABI version; 0 where Landlock is absent, disabled or filtered out (seccomp)."""
    try:
        return _call("landlock_create_ruleset", _SYS_CREATE_RULESET, None, ctypes.c_size_t(0),
                     ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except LandlockError:
        return 0


def _fs_rights(version: int) -> int:
    return _FS_BY_ABI[max(v for v in _FS_BY_ABI if v <= version)]


# Builtin types only in annotations here: importing collections.abc or typing costs `confine` more than the rest.
def restrict(read: list[str] | tuple[str, ...], write: list[str] | tuple[str, ...],
             devices: list[str] | tuple[str, ...], connect_ports: list[int] | tuple[int, ...]) -> int:
    """Put the calling process (no_new_privs already set) in a new domain: `read` trees read-only (and
    executable), `write` trees with every right, `devices` files readable and writable, TCP connect only to
    `connect_ports`, no TCP bind, no signal or abstract unix socket beyond the domain. A path that does not
    exist is skipped. Returns the ABI used; `LandlockError` if it is below `MIN_ABI` or a step fails."""
    version = abi()
    if version < MIN_ABI:
        raise LandlockError(0, f"Landlock ABI {version} here, {MIN_ABI} or later needed")
    everything = _fs_rights(version)
    attr = _RulesetAttr(everything, _NET_BIND_TCP | _NET_CONNECT_TCP, _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL)
    fd = _call("landlock_create_ruleset", _SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)),
               ctypes.c_uint32(0))
    try:
        for paths, rights in ((read, READ_ONLY), (write, everything), (devices, DEVICE)):
            for path in paths:
                _add_path(fd, path, rights & everything)
        for port in connect_ports:
            rule = _NetPort(_NET_CONNECT_TCP, port)
            _call(f"landlock_add_rule(port {port})", _SYS_ADD_RULE, fd, ctypes.c_int(_RULE_NET_PORT),
                  ctypes.byref(rule), ctypes.c_uint32(0))
        _call("landlock_restrict_self", _SYS_RESTRICT_SELF, fd, ctypes.c_uint32(0))
    finally:
        os.close(fd)
    return version


def _add_path(ruleset: int, path: str, rights: int) -> None:
    try:
        target = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        if not stat.S_ISDIR(os.fstat(target).st_mode):
            rights &= _FILE_RIGHTS
        rule = _PathBeneath(rights, target)
        _call(f"landlock_add_rule({path})", _SYS_ADD_RULE, ruleset, ctypes.c_int(_RULE_PATH_BENEATH),
              ctypes.byref(rule), ctypes.c_uint32(0))
    finally:
        os.close(target)
