"""`LocalSandbox`: one rollout's host directories, its commands started by the backend's `Launch` strategy.

Files are read and written on the host, confined to the sandbox's directories (`hostfs`). Commands are host
processes (`proc`): each in a new session, killed by process group, under bubblewrap the whole PID namespace
with its leader; as root, each joins the sandbox's control group first. `close()` kills every command still
running and then whatever is left in the control group, stops serving the relay, removes the root (a tmpfs:
unmounted) and the group, and gives the uid back.

Disk budget: a tmpfs root refuses writes past it (ENOSPC); without one, a watch measures the sandbox's
directories every `_WATCH_S` and kills its running commands while the budget is passed. Either way
`limits_hit()` then says `disk quota exceeded`: a tmpfs root's is a high-water mark, sampled every millisecond
while any command runs (`sandbox.highwater`: one thread for all sandboxes), so a disk filled and emptied again is still
reported. A spawned command's log has `_LOG_RESERVE` bytes of the budget set aside for it, so an
agent that fills the disk still leaves its log. Its `/dev/shm` is a directory of that root (`launch.SHM_SUBDIR`; a private one per
`fresh` command), inside the same budget. The control group's counters (OOM kills, refused forks) are read
once more just before the group is removed, so `limits_hit()` after `close()` still says what was hit.
"""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType

from coding_agent_env.errors import SandboxError, SandboxStartError, SandboxUnsupportedError
from coding_agent_env.sandbox.base import Attached, ExecResult, FileEntry, Process, RelayEndpoint, Sandbox
from coding_agent_env.sandbox.highwater import HIGH_WATER
from coding_agent_env.sandbox.launcher.inside.treeops import remove_tree
from coding_agent_env.sandbox.local import proc
from coding_agent_env.sandbox.local.cgroup import SandboxCgroup
from coding_agent_env.sandbox.local.disk import reserve, tree_usage
from coding_agent_env.sandbox.local.hostfs import HostMounts, remove_if_empty
from coding_agent_env.sandbox.local.launch import ROOT_SUBDIRS, SUBDIRS, Box, Command, Launch, host_dirs
from coding_agent_env.sandbox.local.layout import DEFAULT, Identity, LocalLayout, identity, unknown_user_argv
from coding_agent_env.sandbox.local.provision import DirWork, Made, remove_root
from coding_agent_env.sandbox.local.started import StartChecked, StartReport
from coding_agent_env.sandbox.local.netns_relay import RelayServing

__all__ = ["LocalSandbox"]

_REAP_S = 5.0
"""How long close() waits for killed children to be reaped (SIGKILL is prompt; this bounds a stuck one)."""
_WATCH_S = 1.0
"""How often a watched disk budget is measured."""
_FULL_SLACK = 64 * 1024
_LOG_RESERVE = 1 << 20
"""Disk set aside in a spawned command's log file (see `_open_log`), out of the sandbox's own budget."""
_START_PROBE_TIMEOUT_S = 10.0
"""How long the check that the sandbox can start anything at all (`_confirm_start_failure`) may take."""
_START_PROBE_OUTPUT_BYTES = 4096
"""Output kept of that check (bwrap's message is one line)."""
_MAX_START_ERROR_CHARS = 300
"""Characters of bwrap's (or a launcher's) own message kept in a `SandboxStartError`."""
_ATTACH_STDIO = 'exec "$@" <&{stdin} >&{stdout} 2>&{stdout} {stdin}<&- {stdout}>&-'
"""An attached command's first step inside the sandbox: its pipes, inherited at their own numbers, onto stdio."""
_INLINE_WRITE = 64 * 1024
"""Writes up to this size run on the event loop (a thread's hand-offs would cost more than the write)."""
"""A tmpfs with less than this free is full (a write of that size would fail)."""


class LocalSandbox(Sandbox):
    """Built by `LocalBackend.create`. `release(uid)` gives the uid back once the sandbox is gone."""

    backend = "local"

    def __init__(
        self,
        launch: Launch,
        made: Made,
        uid: int | None,
        *,
        limits: Mapping[str, int],
        enforced: Mapping[str, int],
        scopes: Mapping[str, str],
        disk_budget: int,
        relay: RelayEndpoint | None,
        relay_port: int,
        agents_source: str | None,
        release: Callable[[int | None], None],
        dirs: DirWork,
        layout: LocalLayout | None = None,
        userns: int | None = None,
        release_users: Callable[[], None] | None = None,
        guard_source: Path | None = None,
    ) -> None:
        """`layout`: what its spec asks (checked); `userns`: the user namespace of a sandbox with users (ours
        now: closed at close), `release_users` gives its id range back once its processes are gone;
        `guard_source`: the path guard's host directory (`sandbox.pathguard.install`)."""
        super().__init__()
        layout = layout or LocalLayout()
        self._layout = layout
        self._release_users = release_users
        root, reserved = made.root, made.reserved
        self._launch = launch
        self._release = release
        self._dirs = dirs
        self._netns = made.netns
        self._cgroup = made.cgroup
        self._tmpfs = made.tmpfs
        self._disk_budget = disk_budget
        self._disk_over = False
        self._watch: asyncio.Task[None] | None = None
        self._mark = HIGH_WATER.mark(root, _FULL_SLACK) if self._tmpfs else None
        self._hits_at_close: list[str] | None = None
        self._keep_root = False
        """Set by `freeze`: close keeps the root and the uid (a group's template owns them then)."""
        self._closing: asyncio.Future[None] | None = None
        self._children = proc.Children()
        """Running children by process group, and starts under way: what close() waits for, kills and reaps."""
        self.id = root.name
        self.isolation = launch.isolation
        hosts = host_dirs(root)
        self.paths = launch.paths(hosts, workdir=layout.workdir, tests=layout.tests)
        roots = tuple((path, root / sub) for path, sub in layout.roots)
        mounts = HostMounts(
            {**{getattr(self.paths, key): hosts[key] for key in SUBDIRS}, **dict(roots)},
            self.paths.workdir,
            (uid, uid) if uid is not None else None,
            canonical=True,  # `root` comes from the provisioner, resolved
        )
        procs = made.cgroup.procs if made.cgroup is not None else ()
        self._box = Box(root, uid, limits, self.shell, mounts, relay, relay_port, agents_source, procs,
                        self.paths, roots, userns, guard_source)
        self.limits = MappingProxyType(dict(enforced))
        self.limit_scopes = MappingProxyType(dict(scopes))
        self.network = launch.network(relay)
        self.relay_url = launch.relay_url(relay, relay_port) if relay is not None else None
        self.agents_dir = launch.agents_dir(agents_source) if agents_source is not None else None
        self.path_guard = launch.path_guard(guard_source, uid) if guard_source is not None else None
        self._forwards = relay is not None and launch.forwards_relay
        self._serving = (
            RelayServing(relay, relay_port, reserved)
            if relay is not None and relay.serve is not None and launch.own_netns and uid is not None
            else None
        )
        if self._serving is None and reserved is not None:
            reserved.close()
        if not self._tmpfs:
            self._watch = asyncio.ensure_future(self._watch_disk())

    @property
    def root(self) -> Path:
        """The sandbox's host root (resolved)."""
        return self._box.root

    @property
    def subdirs(self) -> tuple[str, ...]:
        """Its root's directories: the standard ones and its further writable roots'."""
        return (*ROOT_SUBDIRS, *self._layout.subdirs)

    @property
    def host_uid(self) -> int | None:
        """The host uid the sandbox's processes run as (as root, one of the pool), else None."""
        return self._box.uid

    def host_path(self, path: str) -> Path:
        """Where sandbox path `path` is on the host (confined like every file operation)."""
        return self._box.mounts.host_path(path)

    def _who(self, argv: Sequence[str], user: str | None) -> tuple[Sequence[str], Identity]:
        """(argv, who runs it) for `user`: refused without `SandboxSpec.users`; a user the sandbox does not know
        gets a command that says so and exits 127 (as the sandbox's own user), never the caller's."""
        if user is None:
            return argv, DEFAULT
        if self._box.userns is None:
            raise SandboxUnsupportedError("local", "users", f"this sandbox was made without users: cannot run as "
                                                            f"{user[:40]!r}")
        who = identity(user)
        if isinstance(who, str):
            return unknown_user_argv(self.shell, who), DEFAULT
        return argv, who

    def _env(self, env: Mapping[str, str] | None, fresh_dir: Path | None) -> dict[str, str]:
        full = self.base_env()
        if fresh_dir is not None:
            full["HOME"] = full["TMPDIR"] = str(fresh_dir)
        if env:
            full.update(env)
        return full

    async def exec(
        self,
        argv: Sequence[str],
        *,
        timeout: float,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        fresh: bool = False,
        max_output_bytes: int,
        user: str | None = None,
    ) -> ExecResult:
        self._check_open()
        argv, who = self._who(argv, user)
        fresh_dir = self._launch.fresh_home(self._box) if fresh else None
        fresh_shm = self._launch.fresh_shm(self._box) if fresh else None
        self._sampled()
        try:
            run = functools.partial(self._run, fresh=fresh, shm=fresh_shm, who=who, env=self._env(env, fresh_dir),
                                    max_output_bytes=max_output_bytes, netns=self._netns)
            result, started = await run(argv, cwd or self.paths.workdir, timeout)
            if started is False and not result.timed_out and (result.exit_code or 0) >= 0:
                await self._confirm_start_failure(run)
            self._note_full_disk()
            return result
        except OSError as exc:
            raise SandboxError(f"cannot start command: {exc.strerror}") from exc
        finally:
            self._unsampled()
            for fresh_made in (fresh_dir, fresh_shm):
                if fresh_made is not None:  # the command filled it: unbounded
                    await asyncio.shield(asyncio.to_thread(remove_tree, fresh_made))

    async def _run(
        self, argv: Sequence[str], cwd: str, timeout: float, *, fresh: bool, shm: Path | None, who: Identity,
        env: Mapping[str, str], max_output_bytes: int, netns: int | None, forwarder: bool = False,
    ) -> tuple[ExecResult, bool | None]:
        """Run one command to its end in network namespace `netns` (`Launch.command`); (its result, whether
        bwrap started it: None where the launch does not say, `started`)."""
        report = StartReport() if self._launch.reports_start else None
        try:
            command = self._launch.command(
                self._box, argv, cwd, fresh=fresh, netns=netns, forwarder=forwarder, shm=shm, who=who,
                status_fd=report.write_fd if report is not None else None,
            )
            result = await proc.run_capped(
                command.argv, env=env, cwd=command.cwd, creds=command.creds, timeout=timeout,
                max_output_bytes=max_output_bytes, track=self._children, pass_fds=command.pass_fds,
            )
            return result, report.started() if report is not None else None
        finally:
            if report is not None:
                report.close()

    async def _confirm_start_failure(self, run: Callable[..., Awaitable[tuple[ExecResult, bool | None]]]) -> None:
        """bwrap exited without starting a command: `SandboxStartError` (an infrastructure fault, with bwrap's
        own message) when the sandbox's plumbing itself is broken, i.e. a shell's `exit 0` in `/` with the same
        binds (`run`) cannot start either and no limit of the sandbox was hit. Otherwise it was the command's
        own doing (its `--chdir` into a directory its agent made unreadable, a process limit its agent's
        leftovers hold): its exit status stands (`started`). Asked once the sandbox is closing or closed (a spawn
        waited for late), nothing runs: its uid, root, group and namespaces are gone or going (the descriptor
        numbers `run` names may be another sandbox's by then), and the exit status stands."""
        if self.closed or self._hits():
            return
        probe, started = await run([self.shell, "-c", "exit 0"], "/", _START_PROBE_TIMEOUT_S)
        if started is not False or probe.timed_out:
            return
        raise SandboxStartError(f"the sandbox could not start the command: {_first_error(probe.stderr)}")

    async def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        log_path: str | None = None,
        user: str | None = None,
    ) -> Process:
        self._check_open()
        argv, who = self._who(argv, user)
        served = await self._serving.serve_for_spawn() if self._serving is not None else None
        self._check_open()  # closed meanwhile: close() has stopped it
        # The forwarder's command gets a namespace of its own from bwrap, for the forwarder's port.
        forwarder = self._forwards and served is None
        netns = None if forwarder else served.netns if served is not None and served.netns is not None else self._netns
        report = StartReport() if self._launch.reports_start else None
        try:
            command: Command = self._launch.command(
                self._box, argv, cwd or self.paths.workdir, fresh=False, netns=netns, forwarder=forwarder, who=who,
                status_fd=report.write_fd if report is not None else None,
            )
            out = self._open_log(log_path) if log_path else os.open(os.devnull, os.O_WRONLY)
            try:
                child = await proc.start(
                    command.argv, env=self._env(env, None), cwd=command.cwd, creds=command.creds, stdout=out,
                    stderr=out, pass_fds=command.pass_fds, track=self._children,
                )
            finally:
                os.close(out)
                if report is not None:
                    report.close_write()
        except BaseException as exc:
            if report is not None:
                report.close()
            if served is not None:
                await asyncio.shield(served.stop())  # no agent: nothing may reach the relay
            if isinstance(exc, OSError):
                raise SandboxError(f"cannot start process: {exc.strerror}") from exc
            raise
        self._sampled()

        async def exited() -> None:
            self._unsampled()
            if served is not None:
                await served.stop()

        process = proc.HostProcess(child, self._children, on_exit=exited)
        if report is None:
            return process
        # The check runs once the process has exited, when a namespace made for this spawn alone is closed
        # (`exited`): it runs in the sandbox's own, as `exec` does.
        apart = served is not None and served.netns is not None
        run = functools.partial(self._run, fresh=False, shm=None, who=who, env=self._env(env, None),
                                max_output_bytes=_START_PROBE_OUTPUT_BYTES, netns=self._netns if apart else netns,
                                forwarder=forwarder)
        return StartChecked(process, report, functools.partial(self._confirm_start_failure, run))

    async def attach(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
    ) -> Attached:
        self._check_open()
        argv, who = self._who(argv, user)
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        # The pipes reach the command at other numbers, which it moves onto its stdio itself: bubblewrap's PID 1
        # keeps only stdio (here /dev/null), so no process of the sandbox but the command holds them.
        moved = [self.shell, "-c", _ATTACH_STDIO.format(stdin=stdin_r, stdout=stdout_w), "attach", *argv]
        command = self._launch.command(self._box, moved, cwd or self.paths.workdir, fresh=False, netns=self._netns,
                                       who=who)
        try:
            child = await proc.start(command.argv, env=self._env(env, None), cwd=command.cwd, creds=command.creds,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     pass_fds=(*command.pass_fds, stdin_r, stdout_w), track=self._children)
        except BaseException as exc:
            for fd in (stdin_w, stdout_r):
                os.close(fd)
            if isinstance(exc, OSError):
                raise SandboxError(f"cannot start process: {exc.strerror}") from exc
            raise
        finally:
            os.close(stdin_r)
            os.close(stdout_w)
        self._sampled()
        process = proc.HostProcess(child, self._children, on_exit=self._attached_exited)
        loop = asyncio.get_running_loop()
        stdin = os.fdopen(stdin_w, "wb", buffering=0)  # owns the fd from here: closed with it
        try:
            reader, reading = await proc.pipe_reader(loop, stdout_r)
            try:
                writer, _ = await loop.connect_write_pipe(asyncio.Protocol, stdin)
            except BaseException:
                reading.close()
                raise
        except BaseException:
            stdin.close()
            await asyncio.shield(process.kill())
            raise
        return Attached(process, reader, reading, writer)  # type: ignore[arg-type]

    async def _attached_exited(self) -> None:
        self._unsampled()

    def _open_log(self, log_path: str) -> int:
        """The spawned command's log, opened for appending; on a tmpfs root its first `_LOG_RESERVE` bytes are
        set aside (`disk.reserve`), so an agent that fills the disk still leaves a log."""
        fd = self._box.mounts.create(log_path, 0o644, append=True)
        if self._tmpfs:
            reserve(fd, _LOG_RESERVE)
        return fd

    async def read_bytes(self, path: str, *, max_bytes: int | None = None, tail: bool = False) -> bytes:
        self._check_open()
        # Off the loop: whatever the sandbox left at `path`, only this thread can wait on it.
        return await asyncio.to_thread(self._box.mounts.read, path, max_bytes, tail)

    async def mkdir(self, path: str) -> None:
        self._check_open()
        self._box.mounts.mkdir(path)  # a few system calls, none of which waits on what the sandbox made

    async def write_bytes(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        self._check_open()
        # Nothing at the path is opened (see `hostio.create_file`): only the writing itself takes time.
        if len(data) <= _INLINE_WRITE:
            self._box.mounts.write(path, data, mode)
        else:
            await asyncio.to_thread(self._box.mounts.write, path, data, mode)

    async def remove(self, path: str) -> None:
        self._check_open()
        await asyncio.to_thread(self._box.mounts.remove, path)  # a tree the sandbox made: unbounded

    async def list_files(self, path: str, *, max_entries: int) -> tuple[list[FileEntry], bool]:
        self._check_open()
        return await asyncio.to_thread(self._box.mounts.list, path, max_entries)

    async def limits_hit(self) -> list[str]:
        if self._hits_at_close is not None:
            return list(self._hits_at_close)
        self._note_full_disk()
        return self._hits()

    def _hits(self) -> list[str]:
        hits = self._cgroup.hits() if self._cgroup is not None else []
        if self._disk_over:
            hits.append(f"disk quota exceeded: the sandbox's disk budget of {self._disk_budget >> 20} MB")
        return hits

    def _note_full_disk(self) -> None:
        """A tmpfs root that is (nearly) full now, or was while commands ran (`highwater`): the budget was
        reached (what failed with ENOSPC says so too)."""
        if self._mark is not None and not self._disk_over and not self.closed:
            self._mark.sample()
            self._disk_over = self._mark.full

    def _sampled(self) -> None:
        """A command starts: the disk's high-water mark is sampled while it runs (a tmpfs root)."""
        if self._mark is not None:
            HIGH_WATER.started(self._mark)

    def _unsampled(self) -> None:
        if self._mark is not None:
            HIGH_WATER.ended(self._mark)

    async def _watch_disk(self) -> None:
        """The watched budget (no tmpfs): measure every `_WATCH_S`; while it is passed, kill what runs."""
        while True:
            await asyncio.sleep(_WATCH_S)
            used = await asyncio.to_thread(tree_usage, self._box.root)
            if used > self._disk_budget:
                self._disk_over = True
                for child in list(self._children.values()):
                    child.kill_tree()

    async def freeze(self) -> None:
        """Close (every process killed, its control group and namespaces gone) but keep the root and its files
        as they are, and the uid: what a group's template (`fork.LocalTemplate`) takes over."""
        self._keep_root = True
        await self.close()

    async def _close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        if self._mark is not None:
            HIGH_WATER.forget(self._mark)
        # Before any await: even a close cancelled at once has killed.
        killed = [child.kill_tree() for child in self._children.values()]
        if self._serving is not None:
            self._serving.release_reserved()
        # Shielded (and referenced, so it runs to the end): a cancelled close still reaps, removes
        # everything and returns the uid to the pool.
        self._closing = asyncio.ensure_future(self._finish_close(killed))
        await asyncio.shield(self._closing)

    async def _finish_close(self, killed: list[asyncio.Future[object]]) -> None:
        # A start under way on a spawn thread (the sandbox was open when it began) passes the namespaces'
        # descriptors by number: they stay open until it has made its child, which is then killed too.
        if self._children.starting:
            await self._children.settled()
            killed += [child.kill_tree() for child in self._children.values()]
        if self._netns is not None:
            os.close(self._netns)  # the namespace goes with its last process
            self._netns = None
        if self._box.userns is not None:
            os.close(self._box.userns)  # likewise; no command can start any more (closed)
        if killed:
            await asyncio.wait(killed, timeout=_REAP_S)
        if self._serving is not None:
            await self._serving.close()
        box = self._box
        if self._cgroup is not None:
            # Whatever is left in the group: under bubblewrap nothing (its namespaces went with the commands),
            # unisolated what left its process group. Usually empty at once: a few file reads.
            cgroup = self._cgroup
            if cgroup.pids():
                await asyncio.to_thread(cgroup.kill, deadline_s=_REAP_S)
        elif self._launch.kills_by_uid(box):
            # Unisolated processes may have left their group (setsid): end everything of this uid.
            await proc.kill_all_of_uid(proc.HostCredentials(box.uid, box.uid))
        try:
            if self._keep_root:
                pass  # a template's now
            elif self._tmpfs:
                await self._dirs.run(functools.partial(remove_root, box.root, True))  # unmounting frees it all
            elif not await self._dirs.run(
                functools.partial(remove_if_empty, box.root, (*ROOT_SUBDIRS, *self._layout.subdirs))
            ):
                await asyncio.to_thread(remove_tree, box.root)  # what the sandbox left: unbounded
        finally:
            # The group's counters go with it: read them a last time (its processes are all dead by now).
            self._hits_at_close = self._hits()
            if self._cgroup is not None and not self._cgroup.remove():
                await asyncio.to_thread(_kill_and_remove, self._cgroup)
            self._dirs.live -= 1
            if not self._keep_root:
                self._release(box.uid)
            if self._release_users is not None:
                self._release_users()  # its processes are all dead: no file of the range is written any more


def _first_error(stderr: bytes) -> str:
    """The launcher's or bwrap's own message (its last `bwrap:` line, else its last line), printable and
    bounded."""
    lines = [line.strip() for line in stderr.decode("utf-8", "replace").splitlines() if line.strip()]
    ours = [line for line in lines if line.startswith("bwrap:")]
    text = (ours or lines or ["(no message)"])[-1]
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text[:_MAX_START_ERROR_CHARS]


def _kill_and_remove(cgroup: SandboxCgroup) -> None:
    if cgroup.kill(deadline_s=_REAP_S):
        cgroup.remove()
