"""Test helpers that look at the host the way an operator would (/proc and the state dir), and wait for it."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

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
    # `relay` holds the forwarder copy, `bubblewrap` the bundled bwrap installed for sandbox uids, `results.sqlite`
    # the results store (and its WAL files): the server's; `builds` holds image build contexts while they build.
    found = sorted(p.name for p in settings.state_dir.iterdir()
                   if p.name not in ("relay", "bubblewrap", "builds") and not p.name.startswith("results.sqlite"))
    builds = settings.state_dir / "builds"
    found += sorted(f"builds/{p.name}" for p in builds.iterdir()) if builds.is_dir() else []
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


async def poll(condition: Callable[[], bool], deadline_s: float = 10.0) -> None:
    """Wait until `condition()` holds, failing the test at the deadline (never a fixed sleep)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while not condition():
        assert loop.time() < end, "condition not met before the deadline"
        await asyncio.sleep(0.01)


async def relay_port_refused(box: Sandbox) -> bool:
    """Whether a command exec'd in `box` has its connection to the relay port refused (any other outcome,
    a connection or a failure to try, is False)."""
    assert box.relay_url is not None
    port = box.relay_url.split(":")[2].split("/")[0]
    probe = (f"import errno, socket, sys; code = socket.socket().connect_ex(('127.0.0.1', {port}));"
             " sys.exit(0 if code == errno.ECONNREFUSED else 1)")
    return (await box.exec(["python3", "-c", probe], timeout=30, max_output_bytes=64 * 1024)).exit_code == 0
