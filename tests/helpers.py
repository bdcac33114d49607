"""Test helpers that look at the host the way an operator would (/proc and the state dir), and wait for it.

Waiting: `wait_until` (sync) and `poll` (async) are the suite's one way to wait for something: they call a
condition until it holds and fail the test at a deadline with a message naming what was awaited, never a fixed
sleep. `serving` is the condition "this URL answers" for a server that is starting.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx

from coding_agent_env.sandbox import Sandbox
from coding_agent_env.settings import LocalConfig, Settings


def _read(path: Path) -> str:
    try:
        return path.read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def sandbox_processes(settings: Settings) -> list[str]:
    """Processes that belong to sandboxes of these settings: a command line or cwd under the state dir,
    or (when running as root) a uid from the settings' sandbox uid pool."""
    state = str(settings.state_dir)
    pool = uid_pool(settings)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        status = _read(entry / "stat")
        if status.rpartition(")")[2].split()[:1] == ["Z"]:
            continue  # already dead, waiting to be reaped by its parent
        cmdline = _read(entry / "cmdline")
        try:
            cwd = os.readlink(entry / "cwd")
            uid = entry.stat().st_uid
        except OSError:
            continue
        if state in cmdline or cwd.startswith(state) or (os.geteuid() == 0 and uid in pool):
            found.append(f"pid {entry.name} uid {uid}: {cmdline[:120]}")
    return found


def uid_pool(settings: Settings) -> range:
    """The host uids of the settings' local sandboxes when running as root (none without the local backend)."""
    local = next((c for c in settings.backends if isinstance(c, LocalConfig)), None)
    return range(local.uid_base, local.uid_base + local.uid_count) if local is not None else range(0)


def with_local(settings: Settings, **changes: object) -> Settings:
    """`settings` with its local backend's config changed (e.g. `isolation="none"`), the uid pool kept."""
    return settings.with_backends(
        *(c.model_copy(update=changes) if isinstance(c, LocalConfig) else c for c in settings.backends)
    )


def sandbox_mounts(settings: Settings) -> list[str]:
    state = str(settings.state_dir)
    return [line for line in _read(Path("/proc/self/mountinfo")).splitlines() if state in line]


def sandbox_dirs(settings: Settings) -> list[str]:
    """Sandbox roots, and relay sockets (the relay's own directory stays: it holds the forwarder copy)."""
    if not settings.state_dir.exists():
        return []
    # `relay` holds the forwarder copy, `bubblewrap` the bundled bwrap installed for sandbox uids, `pathguard` verify's
    # path guard, `results.sqlite` the results store (and its WAL files): the server's; `builds` holds image build
    # contexts while they build; `docker-made` the Docker backend's records of what it made (a record left is a
    # container or image left).
    own = ("relay", "bubblewrap", "pathguard", "builds", "docker-made")
    found = sorted(p.name for p in settings.state_dir.iterdir()
                   if p.name not in own and not p.name.startswith("results.sqlite"))
    builds = settings.state_dir / "builds"
    found += sorted(f"builds/{p.name}" for p in builds.iterdir()) if builds.is_dir() else []
    found += sorted(f"docker-made/{p.parent.name}/{p.name}" for p in (settings.state_dir / "docker-made").glob("*/*"))
    return found + sorted(f"relay/{p.name}" for p in (settings.state_dir / "relay").glob("*.sock"))


def sandbox_cgroups(pid: int | None = None) -> list[str]:
    """Control groups of the sandboxes of process `pid` (default: this one): `cae-<pid>-...` below its own
    group, v1 or v2."""
    pid = os.getpid() if pid is None else pid
    mine = f"cae-{pid}-"
    found = []
    for line in _read(Path(f"/proc/{pid}/cgroup")).splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            for mount in (Path("/sys/fs/cgroup") / controller, Path("/sys/fs/cgroup/unified")):
                parent = mount / path.lstrip("/")
                if parent.is_dir():
                    found += [str(child) for child in parent.iterdir() if child.name.startswith(mine)]
    return sorted(set(found))


def leftovers(settings: Settings) -> dict[str, list[str]]:
    found = {
        "processes": sandbox_processes(settings),
        "mounts": sandbox_mounts(settings),
        "dirs": sandbox_dirs(settings),
        "cgroups": sandbox_cgroups(),
    }
    return {kind: items for kind, items in found.items() if items}


T = TypeVar("T")
Described = str | Callable[[], str] | None
"""What a wait is for, in its failure message: a text, a function giving one at the deadline (to show what was
seen last), or None for the condition's own source line."""


def _named(condition: Callable[..., Any], what: Described) -> str:
    if callable(what):
        return what()
    if what is not None:
        return what
    try:
        return inspect.getsource(condition).strip()[:300]
    except (OSError, TypeError):
        return repr(condition)


def wait_until(condition: Callable[[], T], what: Described = None, timeout_s: float = 15.0,
               interval_s: float = 0.02) -> T:
    """Call `condition` until it returns a true value, and return that value; at the deadline fail the test
    (AssertionError naming `what`). An error the condition raises ends the wait at once: that is how a caller
    fails fast, e.g. on a server process that exited. Blocks its thread: in a coroutine, use `poll`."""
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {_named(condition, what)}")
        time.sleep(interval_s)
    return value


async def poll(condition: Callable[[], T | Awaitable[T]], what: Described = None, timeout_s: float = 10.0,
               interval_s: float = 0.01) -> T:
    """`wait_until` for a coroutine: the loop runs between calls, and `condition` may be a coroutine function."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {_named(condition, what)}")
        await asyncio.sleep(interval_s)


def serving(url: str, proc: subprocess.Popen[Any] | None = None, log: Callable[[], str] = lambda: "",
            status: int = 200, timeout_s: float = 2.0) -> Callable[[], bool]:
    """The condition "GET `url` answers `status`" for `wait_until`: no connection yet (or no answer within
    `timeout_s`) is "not yet"; a `proc` that has exited fails the wait at once, with the tail of `log()`."""

    def ready() -> bool:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the server for {url} exited with {proc.returncode}: {log()[-3000:]}")
        try:
            return httpx.get(url, timeout=timeout_s).status_code == status
        except httpx.TransportError:
            return False

    return ready


async def relay_port_refused(box: Sandbox) -> bool:
    """Whether a command exec'd in `box` has its connection to the relay port refused: nothing listening there
    (its own network namespace), or the connection denied (Landlock: EACCES; its seccomp filter refusing the
    TCP socket: EPERM). Any other outcome, a connection or a failure to try, is False."""
    assert box.relay_url is not None
    port = box.relay_url.split(":")[2].split("/")[0]
    probe = ("import errno, socket, sys\n"
             "try:\n    code = socket.socket().connect_ex(('127.0.0.1', %s))\n"
             "except PermissionError as exc:\n    code = exc.errno\n"
             "sys.exit(0 if code in (errno.ECONNREFUSED, errno.EACCES, errno.EPERM) else 1)" % port)
    return (await box.exec(["python3", "-c", probe], timeout=30, max_output_bytes=64 * 1024)).exit_code == 0


def free_port() -> int:
    """A loopback port free now (for a server a test starts in a subprocess)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rollouts_finished(server: Any) -> int:
    """The rollouts a live server itself counted as finished (its Prometheus counter, every label summed)."""
    import httpx

    text = httpx.get(f"{server.http}/metrics", timeout=10).text
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("coding_agent_env_rollouts_finished_total{")))


def dead_url() -> str:
    """A loopback URL nothing listens at."""
    return f"http://127.0.0.1:{free_port()}"
