"""Sandbox uids are unique per host (INTEGRITY 36): a uid is held by a lock on the whole host, so another
process drawing from the same range (a second server, a CLI rollout) never gets a uid a live sandbox runs as,
and one held by a process that died is free again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from coding_agent_env.sandbox import SandboxSpec
from coding_agent_env.sandbox.local.uids import UidPool
from coding_agent_env.settings import Settings
from tests.helpers import uid_pool

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sandbox uids are drawn from a pool only as root")

_HOLDER = """
import sys
from pathlib import Path
from coding_agent_env.sandbox.local.uids import UidPool
pool = UidPool(int(sys.argv[1]), int(sys.argv[2]), **({"lock_dir": Path(sys.argv[3])} if len(sys.argv) > 3 else {}))
print(pool.take(), flush=True)
sys.stdin.read()  # hold it until told (EOF) or killed
"""


class Holder:
    """A second Python process holding one uid of a range."""

    def __init__(self, base: int, count: int, lock_dir: Path | None = None) -> None:
        args = [str(base), str(count), *([str(lock_dir)] if lock_dir is not None else [])]
        self.proc = subprocess.Popen([sys.executable, "-c", _HOLDER, *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # the child prints once it holds its uid (or dies: empty)
        self.uid: int | None = int(line) if line.strip().isdigit() else None
        if self.uid is None:
            self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


@pytest.fixture
def holders() -> Iterator[Callable[..., Holder]]:
    made: list[Holder] = []

    def start(*args: Any) -> Holder:
        made.append(Holder(*args))
        return made[-1]

    yield start
    for holder in made:
        holder.kill()


def test_two_processes_never_hold_one_uid(settings: Settings, holders: Callable[..., Holder]) -> None:
    uids = uid_pool(settings)
    first = holders(uids.start, 2)
    mine = UidPool(uids.start, 2)
    taken = mine.take()
    try:
        assert first.uid is not None and taken != first.uid
        assert holders(uids.start, 2).uid is None  # both taken: a third process gets none
    finally:
        mine.give(taken)
    assert holders(uids.start, 2).uid == taken  # given back: free for anyone on the host


def test_a_dead_holders_uid_is_free_again(settings: Settings, holders: Callable[..., Holder]) -> None:
    uids = uid_pool(settings)
    holder = holders(uids.start, 1)
    with pytest.raises(Exception, match="no free sandbox uid"):
        UidPool(uids.start, 1).take()
    holder.kill()  # SIGKILL: no clean-up of its own, the kernel drops its lock
    pool = UidPool(uids.start, 1)
    assert pool.take() == uids.start
    pool.give(uids.start)


def test_an_explicit_lock_dir_is_where_the_locks_are(state_dir: Path, settings: Settings,
                                                     holders: Callable[..., Holder]) -> None:
    uids = uid_pool(settings)
    holder = holders(uids.start, 4, state_dir)
    assert (state_dir / f"{holder.uid}.lock").is_file()
    pool = UidPool(uids.start, 4, lock_dir=state_dir)
    taken = pool.take()
    assert taken != holder.uid and (state_dir / f"{taken}.lock").is_file()
    pool.give(taken)
    assert not (state_dir / f"{taken}.lock").exists()  # given back: its lock file goes (none pile up)
    holder.kill()


async def test_a_live_sandbox_uid_is_not_handed_out_by_another_process(
    settings: Settings, make_backend: Callable[[str], Any], holders: Callable[..., Holder], assert_no_leftovers: None
) -> None:
    uids = uid_pool(settings)
    box = await make_backend("local")().create(SandboxSpec(rollout_id="uids"))
    try:
        assert box.host_uid in uids  # type: ignore[attr-defined]
        other = holders(uids.start, len(uids))  # another process, the same range: a server or a CLI
        assert other.uid != box.host_uid  # type: ignore[attr-defined]
    finally:
        await box.close()


_CHURN = """
import os, sys
from pathlib import Path
from coding_agent_env.errors import SandboxError
from coding_agent_env.sandbox.local.uids import UidPool
base, locks, marks, rounds = int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
pool, held = UidPool(base, 1, lock_dir=locks), 0
while held < rounds:
    try:
        uid = pool.take()
    except SandboxError:
        continue
    # Held: nobody else may hold it now (O_EXCL fails if another holder's mark is there).
    fd = os.open(marks / str(uid), os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    os.close(fd)
    os.unlink(marks / str(uid))
    pool.give(uid)
    held += 1
"""


def test_processes_taking_and_giving_one_uid_never_hold_it_together(state_dir: Path, settings: Settings) -> None:
    uid = uid_pool(settings).start
    locks, marks = state_dir / "locks", state_dir / "marks"
    locks.mkdir()
    marks.mkdir()
    churners = [subprocess.Popen([sys.executable, "-c", _CHURN, str(uid), str(locks), str(marks), "300"],
                                 stderr=subprocess.PIPE, text=True) for _ in range(3)]
    errors = []
    try:
        for churner in churners:
            _, err = churner.communicate(timeout=120)
            errors.append(err if churner.returncode else "")
    finally:
        for churner in churners:
            if churner.poll() is None:
                churner.kill()
            churner.communicate()
    assert not any(errors), [err[-1000:] for err in errors if err]
    assert list(locks.iterdir()) == [] and list(marks.iterdir()) == []
