"""Host subprocesses with bounded output, a deadline and whole-group kill (used by the local backend).

Every process is started in a new session, so `os.killpg(pid)` reaches everything it forked that stayed in
its group. Under bubblewrap the command runs in its own PID namespace, whose init (bwrap's child, in a session
of its own) is outside that group: `Child.kill_tree()` kills it too and waits until it has exited, and the
kernel has then killed and reaped everything in the namespace. So a killed command's whole tree is gone when
the kill returns, not a moment later (`--die-with-parent` only covers a server that dies).

Children are started with `subprocess.Popen` on the server's spawn threads (`spawner`: a start waits for the
child's exec, which on a loaded machine waits for a CPU, and must not hold the event loop meanwhile), and their
exit is watched through a pidfd on the event loop, not through asyncio's subprocess machinery, whose default
child watcher starts (and waits for) one thread per child on the event loop: at a few hundred commands a second
that was a large part of the loop's time. An owner's children (`Children`) include the starts still under way,
so its close can wait for those and kill what they made.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from coding_agent_env.sandbox.base import ExecResult, Process
from coding_agent_env.sandbox.local import spawner

__all__ = ["Child", "Children", "HostCredentials", "HostProcess", "kill_all_of_uid", "kill_group", "run_capped",
           "start"]

_CHUNK = 64 * 1024
_DRAIN_GRACE_S = 2.0
"""After the group is killed, how long to wait for pipes held open by an escaped process."""


@dataclass(frozen=True)
class HostCredentials:
    """The host uid/gid a sandbox's processes run as; None keeps the server's own."""

    uid: int | None = None
    gid: int | None = None


def _exit_of(loop: asyncio.AbstractEventLoop, pidfd: int) -> asyncio.Future[object]:
    """Done when the process of `pidfd` has exited (for a PID namespace's init: once everything in the namespace
    is dead and reaped); the pidfd is closed then."""
    done: asyncio.Future[object] = loop.create_future()

    def on_exit() -> None:
        loop.remove_reader(pidfd)
        os.close(pidfd)
        if not done.done():
            done.set_result(None)

    loop.add_reader(pidfd, on_exit)
    return done


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by `pid`; a group that is already gone is fine."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class Child:
    """A started child process; its exit is noticed on the event loop, which reaps it."""

    def __init__(self, popen: subprocess.Popen[bytes], loop: asyncio.AbstractEventLoop) -> None:
        self._popen = popen
        self._loop = loop
        self._exited: asyncio.Future[int] = loop.create_future()
        self.pid = popen.pid
        try:
            self._pidfd = os.pidfd_open(popen.pid)
        except OSError:  # no pidfds here (old kernel, seccomp): a thread waits instead
            self._pidfd = -1
            threading.Thread(target=self._wait_in_thread, name=f"cae-wait-{popen.pid}", daemon=True).start()
        else:
            loop.add_reader(self._pidfd, self._on_exit)

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    async def wait(self) -> int:
        """The exit code (negative for a signal); cancelling the caller does not stop the watch.
        When the leader exits, what it left in its group is killed too (see `_reap`)."""
        return await asyncio.shield(self._exited)

    def kill_group(self) -> None:
        """SIGKILL the child's process group, unless the child was already reaped: its pid, and so the group
        id, may then belong to someone else (another sandbox's command, under heavy spawning)."""
        if self._popen.returncode is None:
            kill_group(self.pid)

    def kill_tree(self) -> asyncio.Future[object]:
        """SIGKILL the group and the leader's own children (before returning), and give a future done once the
        leader is reaped and each of those children has exited. Awaiting it may be cancelled; the kill stands."""
        inner = self._children_pidfds() if self._popen.returncode is None else []
        self.kill_group()
        waits: list[asyncio.Future[object]] = [asyncio.ensure_future(self.wait())]
        for fd in inner:
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            except ProcessLookupError:
                pass  # exited already: its pidfd is readable at once
            waits.append(_exit_of(self._loop, fd))
        return asyncio.gather(*waits)

    def _children_pidfds(self) -> list[int]:
        """pidfds of the leader's children, taken while the leader lives (so none of those pids can have been
        reused yet): under bubblewrap, its PID namespace's init."""
        try:
            with open(f"/proc/{self.pid}/task/{self.pid}/children") as fh:
                pids = [int(word) for word in fh.read().split()]
        except (OSError, ValueError):
            return []
        fds = []
        for pid in pids:
            try:
                fds.append(os.pidfd_open(pid))
            except OSError:
                pass  # gone already, or no pidfds here
        return fds

    def _on_exit(self) -> None:
        self._loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self._finish(self._reap())

    def _wait_in_thread(self) -> None:
        os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)  # exited, not yet reaped
        code = self._reap()
        self._loop.call_soon_threadsafe(self._finish, code)

    def _reap(self) -> int:
        """The leader has exited and is still an unreaped zombie, which keeps its pid (the group id) from
        being reused: kill what it left in its group now, then reap it."""
        kill_group(self.pid)
        return self._popen.wait()

    def _finish(self, code: int) -> None:
        if not self._exited.done():
            self._exited.set_result(code)


class Children(dict[int, Child]):
    """One owner's running children by pid (group id), and how many of its starts are still under way on the
    spawn threads (each lands here as soon as its child exists)."""

    def __init__(self) -> None:
        super().__init__()
        self._starting = 0
        self._settled: asyncio.Event | None = None

    @property
    def starting(self) -> int:
        return self._starting

    async def settled(self) -> None:
        """Returns once no start is under way: every child they made is in the dict (or was killed by a cancelled
        caller). For a close, which must kill what a start in flight made."""
        while self._starting:
            if self._settled is None:
                self._settled = asyncio.Event()
            await self._settled.wait()

    def _began(self) -> None:
        self._starting += 1
        if self._settled is not None:
            self._settled.clear()

    def _ended(self) -> None:
        self._starting -= 1
        if not self._starting and self._settled is not None:
            self._settled.set()


async def start(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | None,
    creds: HostCredentials,
    stdout: int,
    stderr: int,
    pass_fds: Sequence[int] = (),
    stdin: int = subprocess.DEVNULL,
    track: Children | None = None,
) -> Child:
    """Start argv in a new session (with `pass_fds` inherited at their numbers), on a spawn thread; the child is
    in `track` (by group id) from the moment it exists. Without credentials to change, Python spawns it with
    vfork. Cancelled meanwhile: the child, once started, is killed (its tree, as `Child.kill_tree`)."""
    extra: dict[str, object] = {}
    if creds.uid is not None:
        extra = {"user": creds.uid, "group": creds.gid, "extra_groups": []}
    if pass_fds:
        extra["pass_fds"] = tuple(pass_fds)
    loop = asyncio.get_running_loop()

    def arrived(popen: subprocess.Popen[bytes]) -> Child:
        child = Child(popen, loop)
        if track is not None:
            track[child.pid] = child
        return child

    def unwanted(popen: subprocess.Popen[bytes]) -> None:
        child = arrived(popen)
        killed = child.kill_tree()
        if track is not None:
            killed.add_done_callback(lambda _: track.pop(child.pid, None))

    if track is not None:
        track._began()
    try:
        popen = await spawner.popen(
            list(argv), unwanted, stdin=stdin, stdout=stdout, stderr=stderr, env=dict(env), cwd=cwd,
            start_new_session=True, **extra,
        )
        return arrived(popen)
    finally:
        if track is not None:
            track._ended()


class _Sink:
    """Keeps the first `cap` bytes of a stream and counts the rest (memory stays bounded)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.kept = bytearray()
        self.dropped = 0

    async def drain(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(_CHUNK):
            room = max(self.cap - len(self.kept), 0)
            self.kept += chunk[:room]
            self.dropped += len(chunk) - min(room, len(chunk))


async def _pipe_reader(
    loop: asyncio.AbstractEventLoop, read_fd: int, transports: list[asyncio.BaseTransport]
) -> asyncio.StreamReader:
    """A stream over the read end of a pipe whose write end went to the child (our own pipe, not the
    subprocess transport's, whose `wait()` would also wait for every escaped holder of the pipe to exit).
    The transport, which then owns `read_fd`, is appended to `transports` for the caller to close."""
    reader = asyncio.StreamReader(limit=_CHUNK, loop=loop)
    pipe = os.fdopen(read_fd, "rb", buffering=0)
    try:
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader, loop=loop), pipe)
    except BaseException:
        pipe.close()
        raise
    transports.append(transport)
    return reader


async def pipe_reader(loop: asyncio.AbstractEventLoop, read_fd: int) -> tuple[asyncio.StreamReader, asyncio.BaseTransport]:
    """A stream over the read end of a pipe, and its transport (which owns `read_fd`: close it to free it)."""
    transports: list[asyncio.BaseTransport] = []
    reader = await _pipe_reader(loop, read_fd, transports)
    return reader, transports[0]


async def _start_piped(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str | None,
    creds: HostCredentials,
    track: Children,
    transports: list[asyncio.BaseTransport],
    pass_fds: Sequence[int] = (),
) -> tuple[Child, asyncio.StreamReader, asyncio.StreamReader]:
    """Start argv with its stdout and stderr on pipes of ours; (child, stdout reader, stderr reader).

    The start is counted in `track` while under way and the child is there from the moment it exists: a
    concurrent close() either refused the command already or waits for the start (`Children.settled`), keeping
    the descriptors the argv names (the sandbox's namespaces) open until then, and kills the child."""
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    try:
        proc = await start(argv, env=env, cwd=cwd, creds=creds, stdout=out_write, stderr=err_write,
                           pass_fds=pass_fds, track=track)
    except BaseException:
        os.close(out_read)
        os.close(err_read)
        raise
    finally:
        os.close(out_write)
        os.close(err_write)
    loop = asyncio.get_running_loop()
    try:
        out_reader = await _pipe_reader(loop, out_read, transports)
        err_reader = await _pipe_reader(loop, err_read, transports)
    except BaseException:
        if not transports:
            os.close(err_read)  # out_read went with its failed transport
        for transport in transports:
            transport.close()
        await asyncio.shield(proc.kill_tree())
        track.pop(proc.pid, None)
        raise
    return proc, out_reader, err_reader


async def run_capped(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | None,
    creds: HostCredentials,
    timeout: float,
    max_output_bytes: int,
    track: Children,
    pass_fds: Sequence[int] = (),
) -> ExecResult:
    """Run to completion or to `timeout`, then kill the group. Cancellation kills the group too.
    The child is in `track` (by group id) while the command runs, so its owner can kill it from outside."""
    started = time.monotonic()
    transports: list[asyncio.BaseTransport] = []
    proc, out_reader, err_reader = await _start_piped(argv, env, cwd, creds, track, transports, pass_fds)
    out, err = _Sink(max_output_bytes), _Sink(max_output_bytes)
    readers = asyncio.gather(out.drain(out_reader), err.drain(err_reader))
    timed_out = False
    try:
        try:
            async with asyncio.timeout(timeout):
                await proc.wait()
        except TimeoutError:
            timed_out = True
        # What the command left running goes now, so it cannot hold our pipes open (a leader that exited by
        # itself took its group, and under bubblewrap its namespace, with it).
        await proc.kill_tree()
        try:
            async with asyncio.timeout(_DRAIN_GRACE_S):
                await readers
        except TimeoutError:
            pass  # an escaped process still holds a pipe: keep what was read, stop reading
    except BaseException:
        await asyncio.shield(proc.kill_tree())
        raise
    finally:
        readers.cancel()
        # A cancelled gather stores CancelledError as its exception; nobody awaits it after a cancellation.
        readers.add_done_callback(_retrieve)
        for transport in transports:
            transport.close()
        track.pop(proc.pid, None)
    return ExecResult(
        exit_code=proc.returncode,
        stdout=bytes(out.kept),
        stderr=bytes(err.kept),
        duration_s=time.monotonic() - started,
        timed_out=timed_out,
        stdout_dropped=out.dropped,
        stderr_dropped=err.dropped,
    )


def _retrieve(future: asyncio.Future[object]) -> None:
    if not future.cancelled():
        future.exception()


class HostProcess(Process):
    """A background host process; `kill()` SIGKILLs its whole group and reaps it. `on_exit`, if given, runs
    once the process is reaped, before `wait()` or `kill()` returns (whichever sees the exit first)."""

    def __init__(
        self, proc: Child, track: dict[int, Child], on_exit: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        self._proc = proc
        self._track = track
        self._on_exit = on_exit

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    async def wait(self) -> int:
        code = await self._proc.wait()  # whatever the leader left in its group went with it
        self._track.pop(self._proc.pid, None)
        await self._exited()
        return code

    async def kill(self) -> None:
        await asyncio.shield(self._proc.kill_tree())
        self._track.pop(self._proc.pid, None)
        await self._exited()

    async def _exited(self) -> None:
        on_exit, self._on_exit = self._on_exit, None
        if on_exit is not None:
            await asyncio.shield(on_exit())


async def kill_all_of_uid(creds: HostCredentials) -> None:
    """SIGKILL every process of the sandbox's own host uid (`kill(-1)` run as that uid)."""
    if creds.uid is None:
        return
    proc = await start(
        ["kill", "-KILL", "-1"],
        env={"PATH": "/usr/bin:/bin"},
        cwd="/",
        creds=creds,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    await asyncio.shield(proc.wait())
