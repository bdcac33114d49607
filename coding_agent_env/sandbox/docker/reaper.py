"""Labels of this project's containers and template images, and the startup reaper that removes what a dead server
recorded making (`records`): labels name things for operators, they decide nothing."""

from __future__ import annotations

import contextlib
import os
import re
import socket
from pathlib import Path
from typing import Any

import docker.errors

from coding_agent_env.pids import pid_alive, process_start
from coding_agent_env.sandbox.docker.records import dead_records
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
    """Remove the containers and template images that dead servers on this host recorded making (`records`: never
    what a label claims, which a task's image can set), with the host and fork dirs their containers name (under
    the state dir, named for that server, only), then such dirs of dead servers no container names; how many
    containers and images. Blocking (SDK calls through `api`, a `docker.APIClient`): run it in a thread. An object
    another server removes meanwhile is no error; an image still used by a container not ours stays recorded."""
    reaped = 0
    for record in dead_records(state_dir):
        pid = int(record.dir.name.split("-", 1)[0])
        for kind, object_id in record.objects:
            removed = (_remove_container(api, object_id, state_dir, pid) if kind == "c"
                       else _remove_image(api, object_id))
            if removed is not None:
                reaped += removed
                record.drop(kind, object_id)
        record.close()
    listed = api.containers(all=True, filters={"label": LABEL_ROLLOUT})
    # Labels only spare here (a directory some container names is left alone), never steer a removal.
    named = {labels.get(label) for found in listed for labels in [found.get("Labels") or {}]
             for label in (LABEL_HOSTDIR, LABEL_FORKDIR)}
    _reap_dirs(state_dir, named)
    return reaped


def _remove_container(api: Any, container_id: str, state_dir: Path, pid: int) -> int | None:
    """Remove a recorded container and the dirs its labels name that are this backend's (under the state dir,
    named for the dead server `pid`: a label must not steer a recursive removal anywhere else); 1 removed, 0
    gone already."""
    try:
        labels = (api.inspect_container(container_id).get("Config") or {}).get("Labels") or {}
        api.remove_container(container_id, force=True, v=True)
    except docker.errors.NotFound:
        return 0
    for label in (LABEL_HOSTDIR, LABEL_FORKDIR):
        hostdir = labels.get(label)
        if (hostdir and os.path.dirname(hostdir) == str(state_dir)
                and os.path.basename(hostdir).startswith(f"{pid}-docker-")):
            with contextlib.suppress(OSError):
                remove_tree(hostdir)  # iterative, never following a symlink
    return 1


def _remove_image(api: Any, image_id: str) -> int | None:
    """Remove a recorded template image, not forced; 1 removed, 0 gone already, None still in use by a container
    not ours (kept recorded: tried again at the next start)."""
    try:
        api.remove_image(f"sha256:{image_id}", force=False, noprune=False)
    except docker.errors.NotFound:
        return 0
    except docker.errors.APIError as exc:
        if exc.status_code == 409:
            return None
        raise
    return 1


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
