"""Process liveness, for reapers that find state left behind by a server process that died."""

from __future__ import annotations

import os
import time
from pathlib import Path

__all__ = ["pid_alive", "process_start"]


def pid_alive(pid: int) -> bool:
    """True if a process with this pid exists (owned by anyone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists; it just is not ours to signal
    return True


def process_start() -> float:
    """When this process started (epoch seconds), from /proc; now where that cannot be read. What a reaper made
    since then is a live server's, never a dead one's."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()
