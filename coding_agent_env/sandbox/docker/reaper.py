"""Labels of this project's containers and template images, and the startup reaper that removes those a dead
server left behind."""

from __future__ import annotations

import contextlib
import os
import re
import socket
from pathlib import Path
from typing import Any

import docker.errors

from coding_agent_env.pids import pid_alive, process_start
from coding_agent_env.sandbox.launcher.inside.treeops import remove_tree

__all__ = ["LABEL_FORKDIR", "LABEL_HOSTDIR", "LABEL_OWNER", "LABEL_ROLLOUT", "LABEL_TEMPLATE", "owner", "reap"]

LABEL_ROLLOUT = "coding-agent-env.rollout"
LABEL_OWNER = "coding-agent-env.owner"
"""`host/pid` of the server that made the container."""
LABEL_HOSTDIR = "coding-agent-env.hostdir"
"""The container's host directory (control transport), removed with it."""
LABEL_FORKDIR = "coding-agent-env.forkdir"
"""A group member's fork directory (its overlays' upper layers, `layers.ForkDir`), removed with it."""
LABEL_TEMPLATE = "coding-agent-env.template"
"""On a template's image (`template`), with `LABEL_OWNER`, and on every member: the template's id, so an
operator can tell a group's members."""


def owner() -> str:
    """This server process, as `LABEL_OWNER` names it."""
    return f"{socket.gethostname()}/{os.getpid()}"


def reap(api: Any, state_dir: Path) -> int:
    """Remove labelled containers whose owning server (on this host) is gone (group templates kept as their
    layer among them), with their host and fork dirs (and any such dir no container names), then that server's
    template images; how many containers and images.
    Blocking (SDK calls through `api`, a `docker.APIClient`): run it in a thread. One listing each, labels
    included: a container or image another server removes meanwhile is no error."""
    host = socket.gethostname()
    reaped = 0
    listed = api.containers(all=True, filters={"label": LABEL_ROLLOUT})
    named = {labels.get(label) for found in listed for labels in [found.get("Labels") or {}]
             for label in (LABEL_HOSTDIR, LABEL_FORKDIR)}
    for found in listed:
        labels = found.get("Labels") or {}
        pid = _dead_owner(labels, host)
        if pid is None:
            continue
        try:
            api.remove_container(found["Id"], force=True, v=True)
            reaped += 1
        except docker.errors.NotFound:
            pass
        for label in (LABEL_HOSTDIR, LABEL_FORKDIR):
            hostdir = labels.get(label)
            # Only a directory this backend makes (under our state dir, named for the dead server): a label is
            # just a string, and must not steer a recursive removal anywhere else.
            if (hostdir and os.path.dirname(hostdir) == str(state_dir)
                    and os.path.basename(hostdir).startswith(f"{pid}-docker-")):
                with contextlib.suppress(OSError):
                    remove_tree(hostdir)  # iterative, never following a symlink
    _reap_dirs(state_dir, named)
    return reaped + _reap_templates(api, host)


_OURS = re.compile(r"(\d+)-docker-[0-9a-f]{12}")
"""The name of a host or fork directory (`hostdir`, `layers.ForkDir`), exactly."""


def _reap_dirs(state_dir: Path, named: set[str | None]) -> None:
    """Remove this backend's directories of dead servers that no container names (a server killed between
    making one and creating its container): named exactly `<pid>-docker-<12 hex>` under the state dir, of a pid
    that is gone, named by no container at all (whoever owns it: a server in another pid namespace sharing the
    state dir may hold it), and older than this process (a directory made since is a live server's)."""
    started = process_start()
    try:
        entries = list(os.scandir(state_dir))
    except OSError:
        return
    for entry in entries:
        match = _OURS.fullmatch(entry.name)
        if match is None or entry.path in named or pid_alive(int(match.group(1))):
            continue
        with contextlib.suppress(OSError):
            if entry.is_dir(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_mtime < started:
                remove_tree(entry.path)


def _reap_templates(api: Any, host: str) -> int:
    """Remove the template images of dead servers on `host` (after their containers: an image a container
    still uses cannot go). Not forced: one some other container still uses (not ours to remove) stays."""
    reaped = 0
    for found in api.images(filters={"label": LABEL_TEMPLATE}):
        if _dead_owner(found.get("Labels") or {}, host) is None:
            continue
        try:
            api.remove_image(found["Id"], force=False, noprune=False)
            reaped += 1
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: in use by a container we do not own; anything else is real
                raise
    return reaped


def _dead_owner(labels: dict[str, str], host: str) -> int | None:
    """The pid of the server on `host` that `labels` name as owner, if it is gone; else None."""
    owner_host, _, pid = labels.get(LABEL_OWNER, "").rpartition("/")
    if owner_host != host or not pid.isdigit() or pid_alive(int(pid)):
        return None
    return int(pid)
