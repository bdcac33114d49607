"""Host uids for local sandboxes when the server runs as root: one per live sandbox."""

from __future__ import annotations

import threading
from typing import ClassVar

from coding_agent_env.errors import SandboxError

__all__ = ["UidPool"]


class UidPool:
    """The uids `base` .. `base + count - 1`, handed out one per live sandbox.

    A uid is a host resource, not a backend's: every pool of this process draws from one ledger, so two local
    backends with overlapping ranges (two `Backends` in one process, say, one per in-process rollout) never
    give one uid to two live sandboxes (each would then read the other's files, and close() of one, which ends
    every process of its uid, would kill the other's)."""

    _taken: ClassVar[set[int]] = set()
    _ledger: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, base: int, count: int) -> None:
        self._range = range(base, base + count)

    def take(self) -> int:
        """The lowest free uid of the range; `SandboxError` when all are taken."""
        with self._ledger:
            for uid in self._range:
                if uid not in self._taken:
                    self._taken.add(uid)
                    return uid
        raise SandboxError("no free sandbox uid: too many local sandboxes alive")

    def give(self, uid: int) -> None:
        with self._ledger:
            self._taken.discard(uid)
