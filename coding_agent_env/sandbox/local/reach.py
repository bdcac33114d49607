"""Whether a root server's sandboxes can reach their directories under STATE_DIR at all.

As root, a sandbox's commands (and the bwrap that starts them) run as a pool uid that owns nothing on the host
but its sandbox root, so every directory above STATE_DIR must let other users through (search permission). A
STATE_DIR under a private directory (`mktemp -d` makes them 0700) fails every command with `bwrap: Can't find
source path ...: Permission denied`. The backend asks once, at its probe (server start, or a CLI's first
sandbox), and refuses to make sandboxes there, naming the directory in the way and the fix. It sets STATE_DIR's
own mode (`STATE_DIR_MODE`, as provisioning does: the state dir is the server's), never that of a directory above
it. A server that is not root runs its sandboxes as its own user, who can reach whatever it could make, and is not
asked.
"""

from __future__ import annotations

import logging
import os
import stat
import subprocess
from pathlib import Path

__all__ = ["STATE_DIR_MODE", "unreachable_state_dir"]

log = logging.getLogger(__name__)

STATE_DIR_MODE = 0o711
"""STATE_DIR itself: others may traverse it (to their own 0700 roots), not list it."""
_PROBE_TIMEOUT_S = 10.0
"""How long the one process that tries the path as a sandbox uid may take."""
_PROBE = 'cd -- "$1"'


def unreachable_state_dir(state_dir: Path, uid: int) -> str | None:
    """Why host `uid` (a sandbox's) cannot reach `state_dir`, saying which directory is in the way and how to
    fix it; None when it can. `state_dir` is made if missing (mode `STATE_DIR_MODE`). The kernel answers (a
    process run as `uid` changes into it: modes, ACLs and security modules all count); a probe that cannot
    run at all is logged and not held against the directory."""
    state_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(state_dir, STATE_DIR_MODE)
    real = Path(os.path.realpath(state_dir))
    try:
        done = subprocess.run(
            ["/bin/sh", "-c", _PROBE, "cae-reach", str(real)], user=uid, group=uid, extra_groups=[], cwd="/",
            env={"PATH": "/usr/bin:/bin"}, capture_output=True, timeout=_PROBE_TIMEOUT_S, check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("cannot check that sandbox uid %d reaches STATE_DIR %s: %s", uid, real, exc)
        return None
    if done.returncode == 0:
        return None
    blocker = _first_closed(real)
    where = f"{blocker} (mode {stat.S_IMODE(blocker.stat().st_mode):04o})" if blocker is not None else str(real)
    return (
        f"STATE_DIR {state_dir} is out of the sandboxes' reach: their users (host uid {uid} and the pool's "
        f"others) cannot pass {where}, so bubblewrap could not bind any sandbox directory. Let other users "
        f"traverse it (chmod o+x {blocker or real}) or set STATE_DIR under directories they may traverse "
        "(e.g. /var/lib/coding-agent-env)"
    )


def _first_closed(path: Path) -> Path | None:
    """The topmost directory on `path` (itself included) that other users may not search, by its mode bits."""
    for directory in (*reversed(path.parents), path):
        try:
            mode = directory.stat().st_mode
        except OSError:
            return directory
        if not mode & stat.S_IXOTH:
            return directory
    return None
