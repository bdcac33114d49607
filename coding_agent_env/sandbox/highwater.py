"""The disk high-water mark of sandbox filesystems on this host (a local sandbox's tmpfs root, a local Docker
engine's container workdir seen through `/proc/PID/root`): whether each was ever (nearly) full while commands
ran.

The kernel keeps no count of a tmpfs that filled up (writes just fail with ENOSPC), and an agent can fill its
disk and empty it again within one command: a look at the end of each command misses that. So one thread per
process samples `statvfs` of every root whose sandbox has commands running, every `interval_s` (1 ms: a
system call of about a microsecond per root; every 0.1 ms while one is over 80% used), and marks a root full,
for good, once it has less than `slack` bytes free. One thread for all sandboxes, asleep while none runs
anything: the event loop does none of this. A disk kept full for less than an interval can still be missed:
filling one takes far longer, and emptying it takes at least a process to run `rm` (about a millisecond).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

__all__ = ["HIGH_WATER", "HighWater", "Mark"]

_CLOSE = 0.8
"""A root with this share of it used is watched `close_interval_s` apart: the last fifth fills in milliseconds."""


class Mark:
    """One root's mark. `full` turns True once and stays so; `running` counts the commands it is sampled for."""

    def __init__(self, root: Path, slack: int) -> None:
        self.root = root
        self.slack = slack
        self.full = False
        self.running = 0

    def sample(self) -> bool:
        """Look at the root now; whether it is close to full (`_CLOSE` of it used), so worth a closer watch."""
        try:
            st = os.statvfs(self.root)
        except OSError:
            return False  # gone (being removed): nothing to mark
        free = st.f_bavail * st.f_frsize
        if free < self.slack:
            self.full = True
        return free < st.f_blocks * st.f_frsize * (1 - _CLOSE)


class HighWater:
    """The sampler thread and the marks it samples (see the module docstring)."""

    def __init__(self, interval_s: float = 0.001, close_interval_s: float = 0.0001) -> None:
        self._interval = interval_s
        self._close_interval = close_interval_s
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._active: set[Mark] = set()
        self._thread: threading.Thread | None = None

    def mark(self, root: Path, slack: int) -> Mark:
        return Mark(root, slack)

    def started(self, mark: Mark) -> None:
        """A command of `mark`'s sandbox started: sample it until as many have `ended`."""
        with self._lock:
            mark.running += 1
            self._active.add(mark)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="cae-disk-highwater", daemon=True)
                self._thread.start()
            self._wake.notify()

    def ended(self, mark: Mark) -> None:
        """A command of `mark`'s sandbox ended: sampled once more now (what it left), then no longer if it was
        the last."""
        mark.sample()
        with self._lock:
            mark.running = max(mark.running - 1, 0)
            if not mark.running:
                self._active.discard(mark)

    def forget(self, mark: Mark) -> None:
        """The sandbox is closing: never sample its root again."""
        with self._lock:
            mark.running = 0
            self._active.discard(mark)

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._active:
                    self._wake.wait()
                marks = [mark for mark in self._active if not mark.full]
            close = False
            for mark in marks:
                close = mark.sample() or close
            # Sleeping without the lock: `started` and `ended` never wait for a sample.
            time.sleep(self._close_interval if close else self._interval)


HIGH_WATER = HighWater()
"""The one sampler of this process (its thread starts with the first command sampled)."""
