"""Making and removing a local sandbox's host root (and, with a root launcher, its network namespace), and what
bounds it as a whole (`Bounds`: its control group, its root a tmpfs of its disk budget).

A sandbox root is `STATE_DIR/<server pid>-<rollout>-<random>/` with the `ROOT_SUBDIRS`, owned by the sandbox's uid
as root. Roots whose server process is gone are orphans, removed by `reap` (unmounted first).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from coding_agent_env.aio import shielded
from coding_agent_env.errors import SandboxError
from coding_agent_env.pids import pid_alive
from coding_agent_env.sandbox.base import SandboxLimits
from coding_agent_env.sandbox.local import netns
from coding_agent_env.sandbox.local.cgroup import CgroupLimits, Cgroups, SandboxCgroup
from coding_agent_env.sandbox.local.disk import mount_tmpfs, unmount
from coding_agent_env.sandbox.local.fork import LocalTemplate, mount_overlay
from coding_agent_env.sandbox.launcher.inside.treeops import remove_tree
from coding_agent_env.sandbox.local.launch import ROOT_SUBDIRS
from coding_agent_env.sandbox.local.reach import STATE_DIR_MODE

__all__ = ["Bounds", "DirWork", "Made", "Provisioner", "close_namespace", "reap", "remove_root"]

log = logging.getLogger(__name__)
_T = TypeVar("_T")


class DirWork:
    """Where a sandbox's bounded directory work runs (making its root, removing it while it is empty: a few
    system calls, about 1 ms on a healthy disk). Removing whatever a sandbox left is unbounded and always goes
    to a worker thread.

    On the event loop while at most `inline_max_live` sandboxes are alive: a worker thread's two hand-offs
    cost about as much again, and that latency is what a lone rollout feels. With more alive, the loop's own
    time is what matters, so it goes to worker threads; and one call slower than `slow_s` (a busy journal)
    sends all of it to threads for `backoff_s`. `live` counts the sandboxes alive and `making` those being
    made (a burst of creations is as many sandboxes as a crowd of live ones: on main, 128 clients starting
    at once all found none alive and made their roots on the loop, one after another); only the event loop
    changes them."""

    def __init__(self, *, inline_max_live: int = 2, slow_s: float = 0.005, backoff_s: float = 30.0) -> None:
        self.live = 0
        self.making = 0
        self.inline_max_live = inline_max_live
        self.slow_s = slow_s
        self.backoff_s = backoff_s
        self._slow_until = 0.0

    def inline(self) -> bool:
        return self.live + self.making <= self.inline_max_live and time.monotonic() >= self._slow_until

    def timed(self, work: Callable[[], _T]) -> _T:
        started = time.monotonic()
        try:
            return work()
        finally:
            if time.monotonic() - started > self.slow_s:
                self._slow_until = time.monotonic() + self.backoff_s

    async def run(self, work: Callable[[], _T]) -> _T:
        return self.timed(work) if self.inline() else await asyncio.to_thread(work)


@dataclass(frozen=True)
class Bounds:
    """How a backend bounds each sandbox as a whole (as root): `cgroups` to make its control group in (None:
    none can be made here), `tmpfs` whether its root is a tmpfs of its disk budget, `cpu_weight` the group's
    CPU weight (`CgroupLimits.cpu_weight`)."""

    cgroups: Cgroups | None = None
    tmpfs: bool = False
    cpu_weight: int = 100

    def cgroup_limits(self, limits: SandboxLimits) -> CgroupLimits:
        """The group's bounds: a tmpfs root's pages are charged to it, so its memory is raised by the disk
        budget (each budget then holds on its own)."""
        disk = limits.disk_mb << 20 if self.tmpfs else 0
        return CgroupLimits((limits.memory_mb << 20) + disk, limits.max_processes, limits.cpus, self.cpu_weight)


@dataclass(frozen=True)
class Made:
    """A provisioned sandbox: its root, its network namespace (our descriptor) and the socket reserving the
    relay port in it, when made; its control group and whether its root is a tmpfs."""

    root: Path
    netns: int | None = None
    reserved: socket.socket | None = None
    cgroup: SandboxCgroup | None = None
    tmpfs: bool = False

    def undo(self) -> None:
        """Remove what was made (its processes are gone, or were never started)."""
        if self.netns is not None:
            close_namespace(self.netns, self.reserved)
        remove_root(self.root, self.tmpfs)
        if self.cgroup is not None:
            self.cgroup.remove()


class Provisioner:
    """Makes sandbox roots under `state_dir`, with a network namespace each when `with_netns`."""

    def __init__(
        self, state_dir: Path, dirs: DirWork, *, with_netns: bool, bounds: Bounds | None = None,
        limits: SandboxLimits | None = None, subdirs: tuple[str, ...] = ROOT_SUBDIRS,
        modes: Mapping[str, int] | None = None, base: LocalTemplate | None = None,
    ) -> None:
        """`subdirs`: the root's directories (`ROOT_SUBDIRS` and the spec's further roots); `modes`: any of them
        not 0755 (a sandbox with users: a shared `/tmp`, 1777); `base`: a template whose directories each of
        these overlays (a fork: see `fork`)."""
        self._base = base
        self._subdirs = subdirs
        self._modes = dict(modes or {})
        self._state = state_dir
        self._dirs = dirs
        self._with_netns = with_netns
        self._bounds = bounds or Bounds()
        self._limits = limits

    async def make(
        self, rollout_id: str, uid: int | None, reserve_port: int | None, *, release: Callable[[], None]
    ) -> Made:
        """A new sandbox for `uid`, with the relay port reserved in its namespace. Shielded: cancelled, it waits
        for its (bounded) work to finish and undoes it before the cancellation goes on, so nothing is left when
        the caller sees it. On failure or cancellation `release` is called (the uid is free again)."""
        self._dirs.making += 1
        if self._dirs.inline():
            made = asyncio.ensure_future(self._on_loop(rollout_id, uid, reserve_port))
        else:
            made = asyncio.ensure_future(asyncio.to_thread(self._in_thread, rollout_id, uid, reserve_port))
        made.add_done_callback(self._made)
        try:
            return await asyncio.shield(made)
        except asyncio.CancelledError:
            await shielded(_undo(made, release))  # the thread, or the namespace's, still finishes
            raise
        except BaseException:
            release()
            raise

    def _made(self, _: object) -> None:
        self._dirs.making -= 1  # a done callback: on the loop, once, however the making ended

    def _in_thread(self, rollout_id: str, uid: int | None, reserve_port: int | None) -> Made:
        """On a worker thread. The kernel makes the namespace while this thread makes the directories."""
        if not self._with_netns:
            return self.make_root(rollout_id, uid)
        finish = netns.begin_netns(reserve_port)
        try:
            made = self.make_root(rollout_id, uid)
        except BaseException:
            _finish_quietly(finish)
            raise
        return dataclasses.replace(made, **_claim_netns(finish))

    async def _on_loop(self, rollout_id: str, uid: int | None, reserve_port: int | None) -> Made:
        """`_in_thread` with the directories made on the event loop (`DirWork`); the loop awaits the
        namespace's thread rather than blocking on it (making a namespace can wait on a kernel lock)."""
        make_root = functools.partial(self.make_root, rollout_id, uid)
        if not self._with_netns:
            return self._dirs.timed(make_root)
        loop = asyncio.get_running_loop()
        ready = loop.create_future()
        finish = netns.begin_netns(reserve_port, on_done=functools.partial(_wake, loop, ready))
        try:
            made = self._dirs.timed(make_root)
        except BaseException:
            await ready
            _finish_quietly(finish)
            raise
        await ready
        return dataclasses.replace(made, **_claim_netns(finish))

    def make_root(self, rollout_id: str, uid: int | None) -> Made:
        """The sandbox's root with its subdirectories, its tmpfs and control group where `Bounds` say."""
        self._state.mkdir(parents=True, exist_ok=True)
        os.chmod(self._state, STATE_DIR_MODE)  # sandbox uids must traverse to their own (0700) root
        safe = "".join(c for c in rollout_id if c.isalnum())[:12] or "rollout"
        # Resolved here, once, so the sandbox's file operations need not resolve it again.
        root = Path(os.path.realpath(self._state)) / f"{os.getpid()}-{safe}-{secrets.token_hex(4)}"
        bounds, limits = self._bounds, self._limits
        made = Made(root, tmpfs=bounds.tmpfs and limits is not None)
        try:
            root.mkdir(mode=0o700)
            if made.tmpfs:
                assert limits is not None
                mount_tmpfs(root, limits.disk_mb << 20, uid)
            for sub in self._subdirs:
                (root / sub).mkdir(mode=0o755)
                if uid is not None:
                    os.chown(root / sub, uid, uid)
                if sub in self._modes:
                    os.chmod(root / sub, self._modes[sub])
                if self._base is not None:
                    mount_overlay(self._base.root / sub, root, sub, uid, self._base.modes[sub])
            if uid is not None:
                os.chown(root, uid, uid)
            if bounds.cgroups is not None and limits is not None:
                cgroup = bounds.cgroups.make(root.name, bounds.cgroup_limits(limits))
                if cgroup is None:
                    raise SandboxError("cannot make the sandbox's control group (see the server log)")
                made = dataclasses.replace(made, cgroup=cgroup)
                if uid is not None:
                    cgroup.give_to(uid)  # commands the server spawns as the uid join it themselves
        except BaseException as exc:
            made.undo()
            if isinstance(exc, OSError):
                raise SandboxError(f"cannot create sandbox directory: {exc.strerror}") from exc
            raise
        return made


async def _undo(made: asyncio.Future[Made], release: Callable[[], None]) -> None:
    """A make() cancelled while its work ran: once the work is done, remove what it made, then release."""
    try:
        await asyncio.wait([made])
        if not made.cancelled() and made.exception() is None:
            made.result().undo()
    finally:
        release()


def _claim_netns(finish: Callable[[], tuple[int, socket.socket | None]]) -> dict[str, object]:
    try:
        fd, reserved = finish()
    except OSError as exc:
        # Each command's bwrap then makes its own namespace: slower, just as isolated.
        log.warning("no network namespace for a sandbox, each command makes its own: %s", exc)
        return {}
    return {"netns": fd, "reserved": reserved}


def _finish_quietly(finish: Callable[[], tuple[int, socket.socket | None]]) -> None:
    """Wait for a namespace being made and close it (and its reserved port)."""
    try:
        close_namespace(*finish())
    except OSError:
        pass


def _wake(loop: asyncio.AbstractEventLoop, ready: asyncio.Future[None]) -> None:
    """From another thread: resolve `ready` on its loop (a loop already closed has nobody waiting)."""
    try:
        loop.call_soon_threadsafe(lambda: None if ready.done() else ready.set_result(None))
    except RuntimeError:
        pass


def close_namespace(fd: int, sock: socket.socket | None) -> None:
    if sock is not None:
        sock.close()
    os.close(fd)


def reap(state: Path) -> int:
    """Remove sandbox roots under `state` whose server process is gone; how many."""
    if not state.is_dir():
        return 0
    reaped = 0
    for entry in state.iterdir():
        pid_text = entry.name.split("-", 1)[0]
        if not pid_text.isdigit() or pid_alive(int(pid_text)):
            continue
        remove_root(entry, tmpfs=True)
        reaped += 1
    return reaped


def remove_root(root: Path, tmpfs: bool) -> None:
    """Remove a sandbox root; one that may be a tmpfs is unmounted first (which frees all it holds)."""
    if tmpfs and unmount(root):
        try:
            root.rmdir()
            return
        except OSError:
            pass  # something under the mount point itself: remove it as any tree
    remove_tree(root)
