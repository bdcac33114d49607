"""Labels of this project's containers, and the startup reaper that removes those a dead server left behind."""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path
from typing import Any

import docker.errors

from coding_agent_env.pids import pid_alive
from coding_agent_env.sandbox.launcher.inside.treeops import remove_tree

__all__ = ["LABEL_HOSTDIR", "LABEL_OWNER", "LABEL_ROLLOUT", "owner", "reap"]

LABEL_ROLLOUT = "coding-agent-env.rollout"
LABEL_OWNER = "coding-agent-env.owner"
"""`host/pid` of the server that made the container."""
LABEL_HOSTDIR = "coding-agent-env.hostdir"
"""The container's host directory (control transport), removed with it."""


def owner() -> str:
    """This server process, as `LABEL_OWNER` names it."""
    return f"{socket.gethostname()}/{os.getpid()}"


def reap(api: Any, state_dir: Path) -> int:
    """Remove labelled containers whose owning server (on this host) is gone, with their host dirs; how many.
    Blocking (SDK calls through `api`, a `docker.APIClient`): run it in a thread. One listing, labels included:
    a container another server removes meanwhile is no error."""
    host = socket.gethostname()
    reaped = 0
    for found in api.containers(all=True, filters={"label": LABEL_ROLLOUT}):
        labels = found.get("Labels") or {}
        owner_host, _, pid = labels.get(LABEL_OWNER, "").rpartition("/")
        if owner_host != host or not pid.isdigit() or pid_alive(int(pid)):
            continue
        try:
            api.remove_container(found["Id"], force=True, v=True)
            reaped += 1
        except docker.errors.NotFound:
            pass
        hostdir = labels.get(LABEL_HOSTDIR)
        # Only a directory this backend makes (under our state dir, named for the dead server): a label is
        # just a string, and must not steer a recursive removal anywhere else.
        if (hostdir and os.path.dirname(hostdir) == str(state_dir)
                and os.path.basename(hostdir).startswith(f"{pid}-docker-")):
            with contextlib.suppress(OSError):
                remove_tree(hostdir)  # iterative, never following a symlink
    return reaped
