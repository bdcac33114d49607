"""The seccomp filter of a Landlock sandbox (classic BPF assembled here; ctypes, stdlib only).

Refused with EPERM: new namespaces (unshare, setns, clone with a CLONE_NEW* flag), ptrace and reading or
writing other processes' memory, kernel keyrings, bpf, perf_event_open, io_uring, every mount call, modules,
kexec, reboot, swap, accounting, quotas, hostname, the tty injection ioctl (TIOCSTI), and leaving the process
group the server kills (setsid, setpgid). Limits and priorities only of the command itself (pid 0 or its own
pid, or its own group): another process's new rlimits (prlimit64), scheduling policy, nice value or I/O
priority, and the whole uid's, are refused, as Landlock's scopes leave them to the uid alone (on this tier the
server's own: a command could set its RLIMIT_CPU to one second, or its RLIMIT_NOFILE to 5). CPU affinity is not
(threads pin themselves by tid). Sockets: unix (and socketpair) always, netlink routing information, TCP over
IPv4/IPv6 only where `inet` (Landlock then says which ports); every other family or protocol (UDP,
raw, packet, SCTP, ...) is refused. clone3 answers ENOSYS (its flags sit in memory a filter cannot read; libc
falls back to clone). x32 system calls are refused; another architecture's (32-bit) kill the process.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct

__all__ = ["SeccompError", "install", "supported"]

_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_X32_BIT = 0x40000000

_NR: dict[str, dict[str, int]] = {
    "x86_64": {
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312, "pidfd_getfd": 438,
        "process_madvise": 440, "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155,
        "chroot": 161, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
        "fspick": 433, "mount_setattr": 442, "swapon": 167, "swapoff": 168, "reboot": 169, "sethostname": 170,
        "setdomainname": 171, "init_module": 175, "finit_module": 313, "delete_module": 176, "kexec_load": 246,
        "kexec_file_load": 320, "acct": 163, "quotactl": 179, "keyctl": 250, "add_key": 248, "request_key": 249,
        "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "name_to_handle_at": 303, "open_by_handle_at": 304, "fanotify_init": 300,
        "lookup_dcookie": 212, "syslog": 103, "vhangup": 153, "iopl": 172, "ioperm": 173, "setsid": 112,
        "setpgid": 109, "clone": 56, "clone3": 435, "socket": 41, "socketpair": 53, "ioctl": 16,
        "prlimit64": 302, "setpriority": 141, "ioprio_set": 251, "sched_setscheduler": 144,
        "sched_setparam": 142, "sched_setattr": 314,
    },
    "aarch64": {
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272, "pidfd_getfd": 438,
        "process_madvise": 440, "unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41,
        "chroot": 51, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
        "fspick": 433, "mount_setattr": 442, "swapon": 224, "swapoff": 225, "reboot": 142, "sethostname": 161,
        "setdomainname": 162, "init_module": 105, "finit_module": 273, "delete_module": 106, "kexec_load": 104,
        "kexec_file_load": 294, "acct": 89, "quotactl": 60, "keyctl": 219, "add_key": 217, "request_key": 218,
        "bpf": 280, "perf_event_open": 241, "userfaultfd": 282, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "name_to_handle_at": 264, "open_by_handle_at": 265, "fanotify_init": 262,
        "lookup_dcookie": 18, "syslog": 116, "vhangup": 58, "setsid": 157, "setpgid": 154, "clone": 220,
        "clone3": 435, "socket": 198, "socketpair": 199, "ioctl": 29,
        "prlimit64": 261, "setpriority": 140, "ioprio_set": 30, "sched_setscheduler": 119,
        "sched_setparam": 118, "sched_setattr": 274,
    },
}
_SELF_ONLY = ("sched_setscheduler", "sched_setparam", "sched_setattr")
"""Calls allowed on the calling thread alone (pid 0, or the command's own pid): on another process of the server's uid (the server itself
on the Landlock tier, which Landlock's scopes do not cover here) they would make it SCHED_IDLE."""
_WHO_SELF = {"setpriority": 2, "ioprio_set": 3}
"""Calls (which, who, value) allowed on this process or its own group alone (who 0 or the command's pid, which
not the user's value given): `PRIO_USER` / `IOPRIO_WHO_USER`, or another pid, would renice or idle the server's I/O."""
_CHECKED = ("clone", "clone3", "socket", "socketpair", "ioctl", "prlimit64", *_SELF_ONLY, *_WHO_SELF)
"""Calls decided on their arguments below; every other name in `_NR` is refused outright."""

_CLONE_NEW_FLAGS = 0x7E020000  # NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
_AF_UNIX, _AF_INET, _AF_NETLINK, _AF_INET6 = 1, 2, 16, 10
_SOCK_STREAM, _SOCK_TYPE_MASK = 1, 0xF
_IPPROTO_TCP, _NETLINK_ROUTE = 6, 0
_TIOCSTI = 0x5412

_RET_KILL_PROCESS, _RET_ERRNO, _RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
_LD_W_ABS, _JEQ, _JGE, _JSET, _AND, _RET = 0x20, 0x15, 0x35, 0x45, 0x54, 0x06
_OFF_NR, _OFF_ARCH, _OFF_ARGS = 0, 4, 16  # struct seccomp_data; an argument's low 32 bits (little-endian)
_ARG, _HIGH_HALF = 8, 4  # each argument's size in seccomp_data, and where its high 32 bits start
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2


class SeccompError(OSError):
    """The filter could not be installed (or not on this architecture)."""


def supported() -> str | None:
    """None where this filter knows the machine's system calls, else why not."""
    machine = os.uname().machine
    return None if machine in _NR else f"no seccomp filter for the {machine} architecture"


class _Asm:
    """Classic BPF with forward jumps to labels (resolved by `assemble`). Not a dataclass: `confine` imports
    this module on every command, and dataclasses costs more to import than the rest of it."""

    def __init__(self) -> None:
        self.code: list[tuple[int, object, object, int]] = []
        self.labels: dict[str, int] = {}

    def op(self, code: int, k: int, jt: object = 0, jf: object = 0) -> None:
        self.code.append((code, jt, jf, k))

    def label(self, name: str) -> None:
        self.labels[name] = len(self.code)

    def assemble(self) -> bytes:
        out = b""
        for index, (code, jt, jf, k) in enumerate(self.code):
            jumps = [self.labels[j] - index - 1 if isinstance(j, str) else j for j in (jt, jf)]
            assert all(0 <= j <= 255 for j in jumps), "a jump out of reach"
            out += struct.pack("=HBBI", code, jumps[0], jumps[1], k)
        return out


def _program(machine: str, inet: bool, pid: int) -> bytes:
    nr = _NR[machine]
    deny, allow = _RET_ERRNO | errno.EPERM, _RET_ALLOW
    a = _Asm()
    a.op(_LD_W_ABS, _OFF_ARCH)
    a.op(_JEQ, _AUDIT_ARCH[machine], 1, 0)
    a.op(_RET, _RET_KILL_PROCESS)
    a.op(_LD_W_ABS, _OFF_NR)
    if machine == "x86_64":
        a.op(_JGE, _X32_BIT, "deny", 0)
    for name, number in nr.items():
        if name not in _CHECKED:
            a.op(_JEQ, number, "deny", 0)
    a.op(_JEQ, nr["clone3"], "nosys", 0)
    a.op(_JEQ, nr["clone"], "clone", 0)
    a.op(_JEQ, nr["socket"], "socket", 0)
    a.op(_JEQ, nr["socketpair"], "socketpair", 0)
    a.op(_JEQ, nr["ioctl"], "ioctl", 0)
    a.op(_JEQ, nr["prlimit64"], "prlimit", 0)
    for name in _SELF_ONLY:
        a.op(_JEQ, nr[name], "self", 0)
    for name in _WHO_SELF:
        a.op(_JEQ, nr[name], name, 0)
    a.op(_RET, allow)
    a.label("prlimit")  # this process's limits, or only reading another's (new limits NULL)
    a.op(_LD_W_ABS, _OFF_ARGS)
    a.op(_JEQ, 0, "allow", 0)
    a.op(_JEQ, pid, "allow", 0)
    a.op(_LD_W_ABS, _OFF_ARGS + 2 * _ARG)
    a.op(_JEQ, 0, 0, "deny")
    a.op(_LD_W_ABS, _OFF_ARGS + 2 * _ARG + _HIGH_HALF)
    a.op(_JEQ, 0, "allow", "deny")
    a.label("self")
    a.op(_LD_W_ABS, _OFF_ARGS)
    a.op(_JEQ, 0, "allow", 0)
    a.op(_JEQ, pid, "allow", "deny")
    for name, user in _WHO_SELF.items():
        a.label(name)
        a.op(_LD_W_ABS, _OFF_ARGS)
        a.op(_JEQ, user, "deny", 0)
        a.op(_LD_W_ABS, _OFF_ARGS + _ARG)
        a.op(_JEQ, 0, "allow", 0)
        a.op(_JEQ, pid, "allow", "deny")
    a.label("clone")
    a.op(_LD_W_ABS, _OFF_ARGS)
    a.op(_JSET, _CLONE_NEW_FLAGS, "deny", "allow")
    a.label("socket")
    a.op(_LD_W_ABS, _OFF_ARGS)
    a.op(_JEQ, _AF_UNIX, "allow", 0)
    a.op(_JEQ, _AF_NETLINK, "netlink", 0)
    a.op(_JEQ, _AF_INET, "inet" if inet else "deny", 0)
    a.op(_JEQ, _AF_INET6, "inet" if inet else "deny", 0)
    a.op(_RET, _RET_ERRNO | errno.EAFNOSUPPORT)
    a.label("inet")
    a.op(_LD_W_ABS, _OFF_ARGS + 8)
    a.op(_AND, _SOCK_TYPE_MASK)
    a.op(_JEQ, _SOCK_STREAM, 0, "deny")
    a.op(_LD_W_ABS, _OFF_ARGS + 16)
    a.op(_JEQ, 0, "allow", 0)
    a.op(_JEQ, _IPPROTO_TCP, "allow", "deny")
    a.label("netlink")
    a.op(_LD_W_ABS, _OFF_ARGS + 16)
    a.op(_JEQ, _NETLINK_ROUTE, "allow", "deny")
    a.label("socketpair")
    a.op(_LD_W_ABS, _OFF_ARGS)
    a.op(_JEQ, _AF_UNIX, "allow", "deny")
    a.label("ioctl")
    a.op(_LD_W_ABS, _OFF_ARGS + 8)
    a.op(_JEQ, _TIOCSTI, "deny", "allow")
    a.label("allow")
    a.op(_RET, allow)
    a.label("deny")
    a.op(_RET, deny)
    a.label("nosys")
    a.op(_RET, _RET_ERRNO | errno.ENOSYS)
    return a.assemble()


class _Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install(*, inet: bool, pid: int) -> None:
    """Install the filter on the calling thread (no_new_privs already set); inherited across exec and fork.
    `inet`: TCP sockets may be made (the `llm` network); `pid`: this process's (the command's, once exec'd:
    its own limits and priorities may be set by pid too, as by 0; its group's id is its pid, a new session's);
    `SeccompError` if the kernel refuses."""
    why = supported()
    if why is not None:
        raise SeccompError(0, why)
    program = _program(os.uname().machine, inet, pid)
    buffer = ctypes.create_string_buffer(program, len(program))
    prog = _Fprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_SECCOMP, ctypes.c_ulong(_SECCOMP_MODE_FILTER), ctypes.byref(prog), 0, 0) != 0:
        code = ctypes.get_errno()
        raise SeccompError(code, f"seccomp filter: {errno.errorcode.get(code, code)}")
