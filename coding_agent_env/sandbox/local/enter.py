"""A tiny compiled helper that starts a local sandbox's bwrap as root (used by the local backend).

As root, every command used to start as `nsenter --net=NS -S uid -G uid -- bwrap ... -- prlimit ... -- CMD`:
two programs exec'd besides bwrap and the command, about a millisecond each, for work that is a handful of
system calls. `cae-enter NETNS UID GID DATA FSIZE CPU NPROC CGROUPS BWRAP [ARG...]` does that work in one exec
and becomes bwrap: it moves itself into the sandbox's control groups (CGROUPS: the files to write `0` to, see
`cgroup.SandboxCgroup.procs`, joined by `:`, or `-`), joins the network namespace NETNS (a path, or `-` to stay), sets the four rlimits (soft = hard,
as `prlimit --name=value` does; `-` leaves one as it is) while still root, drops supplementary groups,
switches gid and uid (real, effective and saved) and execs bwrap, which gains no capability from it (not
setuid). The limits are thus set on bwrap instead of on the command inside: every sandboxed process inherits
them all the same, and RLIMIT_NPROC, set before the uid switch, is checked at the switch and at every later
fork of that uid.

It is compiled from the source below once per server process, with the host's C compiler (`cc`; the CI
installs gcc), into a sealed in-memory file; where there is no compiler, callers keep nsenter and prlimit.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Mapping, Sequence

__all__ = ["argv", "build"]

log = logging.getLogger(__name__)

_COMPILE_TIMEOUT_S = 60.0
SOURCE = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static int fail(const char *what) {
    fprintf(stderr, "cae-enter: %s: %s\n", what, strerror(errno));
    return 126;
}

static int number(const char *text, unsigned long long *out) {
    char *end;
    errno = 0;
    *out = strtoull(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || text[0] == '-') {
        errno = EINVAL;
        return -1;
    }
    return 0;
}

/* Each path is a group's `tasks` (v1) or `cgroup.procs` (v2) file: writing 0 moves the caller in. */
static int join_cgroups(char *list) {
    if (strcmp(list, "-") == 0) return 0;
    for (char *path = strtok(list, ":"); path != NULL; path = strtok(NULL, ":")) {
        int fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0) return -1;
        ssize_t wrote = write(fd, "0\n", 2);
        close(fd);
        if (wrote != 2) return -1;
    }
    return 0;
}

/* cae-enter NETNS UID GID DATA FSIZE CPU NPROC CGROUPS PROGRAM [ARG...] */
int main(int argc, char **argv) {
    static const int resources[] = {RLIMIT_DATA, RLIMIT_FSIZE, RLIMIT_CPU, RLIMIT_NPROC};
    unsigned long long uid, gid, value;
    if (argc < 10) {
        fprintf(stderr, "usage: cae-enter NETNS UID GID DATA FSIZE CPU NPROC CGROUPS PROGRAM [ARG...]\n");
        return 126;
    }
    if (number(argv[2], &uid) != 0 || number(argv[3], &gid) != 0 || uid == 0 || gid == 0)
        return fail("uid/gid");
    /* First: everything from here on, bwrap and the command included, is in the sandbox's groups. */
    if (join_cgroups(argv[8]) != 0) return fail("join cgroup");
    if (strcmp(argv[1], "-") != 0) {
        int fd = open(argv[1], O_RDONLY | O_CLOEXEC);
        if (fd < 0) return fail("open network namespace");
        if (setns(fd, CLONE_NEWNET) != 0) return fail("setns");
        close(fd);
    }
    for (int i = 0; i < 4; i++) {
        if (strcmp(argv[4 + i], "-") == 0) continue; /* not set: the caller bounds it otherwise */
        if (number(argv[4 + i], &value) != 0) return fail("limit");
        struct rlimit limit = {(rlim_t)value, (rlim_t)value};
        if (setrlimit(resources[i], &limit) != 0) return fail("setrlimit");
    }
    if (setgroups(0, NULL) != 0) return fail("setgroups");
    if (setresgid((gid_t)gid, (gid_t)gid, (gid_t)gid) != 0) return fail("setresgid");
    if (setresuid((uid_t)uid, (uid_t)uid, (uid_t)uid) != 0) return fail("setresuid");
    execv(argv[9], argv + 9);
    return fail("exec");
}
"""
LIMITS = ("data", "fsize", "cpu", "nproc")
"""The rlimits the helper sets, in its argument order (names as in `prlimit`)."""
_UNSET = "-"
"""A limit the helper leaves as it is (the process limit, where the sandbox's control group bounds it)."""


def argv(
    helper: str, netns: str | None, uid: int, limits: Mapping[str, int], cgroups: Sequence[str] = ()
) -> list[str]:
    """The helper's argv up to (not including) the program it becomes; a limit of LIMITS not in `limits` is
    left as it is (`-`);
    `cgroups` are the files that move the helper into the sandbox's groups (paths without `:`)."""
    joined = ":".join(cgroups) if cgroups else "-"
    return [helper, netns or "-", str(uid), str(uid), *(str(limits.get(name, _UNSET)) for name in LIMITS), joined]


def build() -> str | None:
    """A path root can exec the helper at, compiled on the first call of this process (a fraction of a
    second); None when there is no C compiler, it fails, or there are no memfds (the answer then stands for
    the process's lifetime). The binary lives in a sealed anonymous file (memfd) of this process: nothing on
    disk to trust, share or clean up. The path, like `netns.join_path`, names this process's own
    close-on-exec descriptor, so no sandboxed process inherits it."""
    global _tried, _memfd
    with _lock:
        if not _tried:
            _tried = True
            try:
                _memfd = _compile()
            except OSError as exc:
                log.warning("no compiled sandbox launcher: %s", exc)
        return f"/proc/{os.getpid()}/fd/{_memfd}" if _memfd is not None else None


_lock = threading.Lock()
_tried = False
_memfd: int | None = None


def _compile() -> int | None:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    with tempfile.TemporaryDirectory(prefix="cae-enter-") as work:
        source, binary = os.path.join(work, "enter.c"), os.path.join(work, "enter")
        with open(source, "w") as fh:
            fh.write(SOURCE)
        # Static when the C library allows it: no dynamic loading at every start (a quarter millisecond).
        for flags in (["-static"], []):
            try:
                done = subprocess.run(
                    [compiler, "-O2", *flags, "-o", binary, source],
                    capture_output=True,
                    timeout=_COMPILE_TIMEOUT_S,
                    env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                    check=False,
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                log.warning("cannot compile the sandbox launcher: %s", exc)
                return None
            if done.returncode == 0:
                break
        else:
            log.warning("cannot compile the sandbox launcher: %s", done.stderr.decode(errors="replace")[-500:])
            return None
        with open(binary, "rb") as fh:
            code = fh.read()
    fd = os.memfd_create("cae-enter", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(code)
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, 0o755)
        # Sealed: the bytes root execs cannot change from here on, by anyone.
        seals = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    except OSError:
        os.close(fd)
        raise
    return fd
