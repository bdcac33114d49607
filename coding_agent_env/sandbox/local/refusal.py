"""The refusal the local backend gives where no isolation tier works and the operator did not opt in to
unisolated commands: each tier's cause in a sentence of its own, then what really helps where the server runs
(inside a container, host settings cannot help; on a host, they can)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["in_container", "no_tier_refusal"]

_CONTAINER_MARKS = (Path("/.dockerenv"), Path("/run/.containerenv"))
_CONTAINER_CGROUPS = ("docker", "kubepods", "containerd", "libpod", "lxc")

_IN_CONTAINER = (
    "Inside a container, only the container's options help: run it with both `--security-opt "
    "seccomp=unconfined` and `--security-opt systempaths=unconfined` (bubblewrap then makes its namespaces; "
    "seccomp=unconfined alone still cannot mount /proc), or on a kernel with Landlock ABI 6 or later (Linux 6.12) "
    "and an engine whose seccomp profile allows the landlock system calls (recent engines' default does; else "
    "`--security-opt seccomp=PROFILE` with landlock_create_ruleset, landlock_add_rule and landlock_restrict_self "
    "allowed), or use the docker or a remote sandbox backend."
)
_ON_HOST = (
    "Install bubblewrap (apt-get install bubblewrap) or point BWRAP_PATH at one that works, and allow "
    "unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1 on Debian, "
    "kernel.apparmor_restrict_unprivileged_userns=0 on Ubuntu); or run a kernel with Landlock ABI 6 or later "
    "enabled (Linux 6.12, `landlock` in the lsm= boot list)."
)
_OPT_IN = (
    "Commands never run unisolated unless the operator opts in (SANDBOX_ALLOW_UNISOLATED=true), and then any of "
    "them can read everything the server's user can."
)


def in_container() -> bool:
    """Whether this process looks like it runs in a container (Docker's or Podman's mark, a container manager's
    variable, or a container's control group)."""
    if any(mark.exists() for mark in _CONTAINER_MARKS) or os.environ.get("container"):
        return True
    try:
        groups = Path("/proc/1/cgroup").read_text(errors="replace")
    except OSError:
        return False
    return any(name in groups for name in _CONTAINER_CGROUPS)


def no_tier_refusal(causes: str, *, container: bool | None = None) -> str:
    """The refusal: `causes` (the probe's sentences: why bubblewrap, why Landlock cannot run) and the fixes for
    where the server runs (`container`; None: `in_container()`)."""
    fixes = _IN_CONTAINER if (in_container() if container is None else container) else _ON_HOST
    return f"No sandbox can be made on this host. {causes} {fixes} {_OPT_IN}"
