"""Host children of the local backend (`sandbox/local/proc.py`): a leader's group is killed while the exited
leader is still unreaped, and never signalled after: a reaped pid (and so its group id) can be reused by
someone else, such as another sandbox's command."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import time

import pytest

from coding_agent_env.sandbox.local import proc


async def _start(script: str) -> proc.Child:
    return await proc.start(["bash", "-c", script], env={"PATH": "/usr/bin:/bin"}, cwd="/",
                            creds=proc.HostCredentials(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def test_a_reaped_child_never_signals_its_old_group(monkeypatch: pytest.MonkeyPatch) -> None:
    child = await _start("exit 3")
    assert await child.wait() == 3
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "killpg", lambda pgid, sig: sent.append((pgid, sig)))
    child.kill_group()
    assert sent == []


async def test_what_the_leader_left_in_its_group_dies_with_it() -> None:
    """The leader leaves a TERM-ignoring background child in its group and exits: by the time `wait()`
    returns, that child is dead too (killed before the leader was reaped, so by a group id still its own)."""
    child = await _start("(trap '' TERM; exec sleep 600) & exit 0")
    assert await child.wait() == 0
    end = time.monotonic() + 5  # SIGKILL was sent; the kernel may take a moment to finish the target off
    while (members := _members(child.pid)) and time.monotonic() < end:
        await asyncio.sleep(0.01)  # polling the kernel's process table with a deadline
    assert members == [], f"left in group {child.pid}: {members}"


def _members(group: int) -> list[str]:
    return [entry for entry in os.listdir("/proc") if entry.isdigit() and _pgid(entry) == group and _alive(int(entry))]


def _pgid(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return int(handle.read().rpartition(")")[2].split()[2])
    except (FileNotFoundError, IndexError, ValueError):
        return None


def _running(marker: str) -> list[int]:
    """PIDs of live processes whose argv holds `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                if marker.encode() in handle.read().split(b"\0") and _alive(int(entry)):
                    found.append(int(entry))
        except (FileNotFoundError, ProcessLookupError, ValueError, NotADirectoryError):
            continue
    return found


async def test_a_start_cancelled_on_its_spawn_thread_leaves_no_child() -> None:
    """Cancelled while its child is being made (on a spawn thread), `start` still waits for the child, kills it
    and forgets it: nothing runs, nothing stays in the owner's `Children`."""
    marker = f"600.{secrets.randbelow(10**6)}"
    track = proc.Children()
    started = asyncio.ensure_future(proc.start(["sleep", marker], env={"PATH": "/usr/bin:/bin"}, cwd="/",
                                               creds=proc.HostCredentials(), stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL, track=track))
    await asyncio.sleep(0)  # under way on a spawn thread
    assert track.starting == 1
    started.cancel()
    with pytest.raises(asyncio.CancelledError):
        await started
    await track.settled()
    end = time.monotonic() + 5
    while (track or _running(marker)) and time.monotonic() < end:
        await asyncio.sleep(0.01)  # the kill is sent; the child's exit is noticed on the loop
    assert not track and not _running(marker)
