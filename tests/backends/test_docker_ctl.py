"""The Docker backend's control-socket path (commands sent to the container's PID 1, `launcher.py init --ctl`):
what a full pids limit, an agent's unremovable files, a malformed or silent PID 1 and a full control queue
must not turn into (a dead container, an uncaught exception, a hang).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from coding_agent_env.errors import SandboxError, SandboxFileError
from coding_agent_env.sandbox import SandboxSpec
from coding_agent_env.sandbox.docker import DockerSandbox
from coding_agent_env.sandbox.docker.control import NO_REPLY_CODE, ControlChannel, CtlSender, parse_hello, parse_reply
from coding_agent_env.sandbox.launcher.client import INSIDE_DIR, OutputCap, forwarder_source, launcher_files, parse_status
from coding_agent_env.settings import LauncherTimeouts
from tests.backends.test_contract import OUT, sh

LAUNCHER = str(INSIDE_DIR / "launcher.py")
BAD_REPLIES = [b"<html>", b'{"nocode": 1}', b'{"code": null}', b"[1]", b'{"code": "0"}', b'{"code": true}',
               b'{"code": 0, "status": 5}', b"\xff\xfe", b"null"]


async def _poll(condition: Callable[[], Any], deadline_s: float = 30.0) -> None:
    end = time.monotonic() + deadline_s
    while not await condition():
        assert time.monotonic() < end, "condition not met before the deadline"
        await asyncio.sleep(0.05)


# -- 1. a full pids limit: PID 1 survives, the agent can be killed, the sandbox works afterwards -----------

_FILL = """
import os, sys, time
n = 0
while True:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(600)
        os._exit(0)
    n += 1
print("full", n, flush=True)
time.sleep(600)
"""


async def test_full_pids_limit_does_not_kill_the_container(make_backend: Callable[[str], Any]) -> None:
    box = await make_backend("docker")(sandbox_max_processes=40).create(SandboxSpec(rollout_id="pids-full"))
    try:
        assert isinstance(box, DockerSandbox) and box.transport.name == "control"
        agent = await box.spawn(["python3", "-c", _FILL], log_path="/logs/fill.log")

        async def full() -> bool:
            try:
                return "full" in await box.read_text("/logs/fill.log")
            except SandboxError:
                return False

        await _poll(full)
        # PID 1 cannot fork for this one: a typed result (no reply), not a crashed PID 1 and a dead container.
        blocked = await box.exec(["true"], timeout=20, max_output_bytes=OUT)
        assert blocked.exit_code == NO_REPLY_CODE and b"no reply" in blocked.stderr
        await asyncio.wait_for(agent.kill(), 60)  # handled inside PID 1: no fork needed
        assert agent.returncode is not None and agent.returncode < 0
        code, out, _ = await sh(box, "echo still usable; ls /logs")
        assert (code, out) == (0, "still usable\nfill.log\n")
        await box.remove("/logs/fill.log")  # verify's own kind of work
        code, out, _ = await sh(box, "ls -A /logs", fresh=True)
        assert (code, out) == (0, "")
    finally:
        await box.close()


def test_init_survives_a_failed_fork_and_still_kills(tmp_path: Path) -> None:
    """The reviewer's stand-in PID 1 (`/tmp/rv/init_fork_fail.py`): the real launcher with fork() failing."""
    ctl = str(tmp_path / "ctl.sock")
    harness = (
        "import os, sys, runpy\n"
        "sys.argv = ['launcher.py', 'init', '--ctl', sys.argv[1]]\n"
        "def fork():\n"
        "    raise BlockingIOError(11, 'Resource temporarily unavailable')\n"
        "os.fork = fork\n"
        f"runpy.run_path({LAUNCHER!r}, run_name='__main__')\n"
    )
    with contextlib.ExitStack() as stack:
        listener = stack.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET))
        listener.bind(ctl)
        listener.listen(1)
        proc = stack.enter_context(subprocess.Popen([sys.executable, "-c", harness, ctl]))
        stack.callback(proc.kill)

        def request(kind: bytes) -> socket.socket:
            pairs = [socket.socketpair() for _ in range(3)]
            for ours, theirs in pairs:
                stack.enter_context(ours)
                ours.settimeout(30)
            socket.send_fds(conn, [kind], [theirs.fileno() for _, theirs in pairs])
            for _, theirs in pairs:
                theirs.close()
            return pairs[0][0]

        listener.settimeout(30)
        conn = stack.enter_context(listener.accept()[0])
        conn.settimeout(30)
        assert json.loads(conn.recv(4096)) == {"error": ""}
        assert request(b"r").recv(4096) == b""  # no fork: the request's fds are closed, no reply
        assert proc.poll() is None, "init exited when fork failed"
        chan = request(b"k")  # a kill request is answered by init itself
        argv = [sys.executable, LAUNCHER, "kill", "--token", "t0", "--run-dir", str(tmp_path)]
        chan.sendall(json.dumps({"argv": argv, "env": {}, "uid": None}).encode())
        chan.shutdown(socket.SHUT_WR)
        assert json.loads(chan.recv(4096)) == {"code": 0, "status": None}
        assert (tmp_path / "t0.kill").exists()
        assert proc.poll() is None


# -- 2. remove(): as root, never through a symlink --------------------------------------------------------

@pytest.mark.parametrize("kind", ["docker", "docker-exec"])
async def test_remove_takes_what_the_agent_made_unremovable(kind: str, make_backend: Callable[[str], Any]) -> None:
    box = await make_backend(kind)().create(SandboxSpec(rollout_id="rm-000"))
    try:
        script = "mkdir -p /logs/verifier/x/y && touch /logs/verifier/x/y/f && chmod 000 /logs/verifier/x"
        code, _, err = await sh(box, script)
        assert code == 0, err
        await box.remove("/logs/verifier")
        code, out, _ = await sh(box, "ls -A /logs")
        assert (code, out) == (0, "")
    finally:
        await box.close()


@pytest.mark.parametrize("kind", ["docker", "docker-exec"])
async def test_remove_never_follows_a_planted_symlink(kind: str, make_backend: Callable[[str], Any]) -> None:
    """Removal runs as root: a symlinked parent must not take it outside the sandbox (attack test)."""
    box = await make_backend(kind)().create(SandboxSpec(rollout_id="rm-link"))
    try:
        code, _, err = await sh(box, "ln -s /etc /workspace/link && mkdir -p /tmp/d && ln -s /etc/hosts /tmp/d/h")
        assert code == 0, err
        with pytest.raises(SandboxFileError):
            await box.remove("/workspace/link/passwd")
        await box.remove("/workspace/link")  # the symlink itself, not its target
        await box.remove("/tmp/d")
        code, out, _ = await sh(box, "ls /etc/passwd /etc/hosts; ls -A /workspace; ls -A /tmp")
        assert out == "/etc/hosts\n/etc/passwd\n", out
    finally:
        await box.close()


# -- 3. malformed or missing replies from PID 1 -----------------------------------------------------------

@pytest.mark.parametrize("raw", BAD_REPLIES)
def test_malformed_replies_are_sandbox_errors(raw: bytes) -> None:
    with pytest.raises(SandboxError):
        parse_reply(raw)
    assert parse_hello(raw)  # a non-empty error text, not an exception
    with pytest.raises(SandboxError):
        parse_status(raw)


def test_well_formed_replies_parse() -> None:
    assert parse_reply(b'{"code": 3, "status": null}') == (3, None)
    assert parse_reply(b'{"code": 137, "status": "{}"}') == (137, "{}")
    assert parse_hello(b'{"error": ""}') == ""
    assert parse_status(b'{"signal": 9, "timed_out": true}') == (-9, True)


class _FakeInit:
    """A stand-in PID 1 on a socketpair: answers each command with `reply`, or (None) holds it forever."""

    def __init__(self, reply: bytes | None) -> None:
        self.host, self.init = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.host.setblocking(False)
        self.reply = reply
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                msg, fds, _, _ = socket.recv_fds(self.init, 16, 3)
            except OSError:
                return
            if not msg:
                return
            socks = [socket.socket(fileno=fd) for fd in fds]
            if self.reply is None:
                self.held += socks
                continue
            while socks[0].recv(65536):
                pass
            socks[0].sendall(self.reply)
            for sock in socks:
                sock.close()

    def box(self, timeouts: LauncherTimeouts = LauncherTimeouts()) -> DockerSandbox:
        """A Docker sandbox whose control channel is this stand-in (no container: commands only)."""
        return DockerSandbox("fake-init", ControlChannel.over(self.host), api=None,
                             spec=SandboxSpec(rollout_id="fake-init"), rlimits={}, container_limits={},
                             timeouts=timeouts, relay_port=1)

    def close(self) -> None:
        self.init.shutdown(socket.SHUT_RDWR)
        self.thread.join(10)
        for sock in self.held:
            sock.close()
        self.init.close()
        self.host.close()


@pytest.fixture
def fake_init(request: pytest.FixtureRequest) -> Iterator[Callable[[bytes | None], _FakeInit]]:
    made: list[_FakeInit] = []

    def make(reply: bytes | None) -> _FakeInit:
        made.append(_FakeInit(reply))
        return made[-1]

    yield make
    for fake in made:
        fake.close()


@pytest.mark.parametrize("raw", BAD_REPLIES)
async def test_a_malformed_reply_fails_exec_with_a_sandbox_error(
        raw: bytes, fake_init: Callable[[bytes | None], _FakeInit]) -> None:
    box = fake_init(raw).box()
    with pytest.raises(SandboxError):
        await box.exec(["true"], timeout=10, max_output_bytes=OUT)


async def test_a_silent_init_does_not_hang_exec(fake_init: Callable[[bytes | None], _FakeInit]) -> None:
    """PID 1 takes the command and the kill and never answers: exec ends with a SandboxError, in bounded time."""
    box = fake_init(None).box(LauncherTimeouts(kill_grace_s=0.1, reply_s=0.5))
    with pytest.raises(SandboxError):
        await asyncio.wait_for(box.exec(["true"], timeout=0.1, max_output_bytes=OUT), 10)


async def test_a_silent_init_does_not_hang_a_cancelled_exec(fake_init: Callable[[bytes | None], _FakeInit]) -> None:
    box = fake_init(None).box(LauncherTimeouts(reply_s=0.5))
    running = asyncio.ensure_future(box.exec(["true"], timeout=100, max_output_bytes=OUT))
    await asyncio.wait([running], timeout=0.2)
    running.cancel()
    done, _ = await asyncio.wait([running], timeout=10)
    assert done and running.cancelled()


async def test_a_silent_init_does_not_hang_machinery(fake_init: Callable[[bytes | None], _FakeInit]) -> None:
    box = fake_init(None).box(LauncherTimeouts(machinery_s=0.5))
    with pytest.raises(SandboxError):
        await asyncio.wait_for(box.remove("/workspace/x"), 10)


# -- 4. sends on a full control queue ---------------------------------------------------------------------

def _fill_queue(sock: socket.socket, fd: int) -> int:
    n = 0
    while True:
        try:
            socket.send_fds(sock, [b"r"], [fd])
        except BlockingIOError:
            return n
        n += 1


@dataclass
class _CtlPair:
    """A control connection with nobody draining PID 1's end: the host's sender, PID 1's socket, and a pipe
    read end to pass as the command's descriptor."""

    sender: CtlSender
    host: socket.socket
    init: socket.socket
    fd: int


@pytest.fixture
def ctl() -> Iterator[_CtlPair]:
    host, init = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    host.setblocking(False)
    init.setblocking(False)
    r, w = os.pipe()
    pair = _CtlPair(CtlSender(host), host, init, r)
    yield pair
    pair.sender.close()
    init.close()
    os.close(r)
    os.close(w)


async def test_concurrent_sends_on_a_full_queue_all_complete(ctl: _CtlPair) -> None:
    """The reviewer's `sendfds_hang.py`: two senders wait for room; both must be sent once PID 1 drains."""
    queued = _fill_queue(ctl.host, ctl.fd)
    senders = [asyncio.ensure_future(ctl.sender.send(b"r", [ctl.fd])) for _ in range(3)]
    await asyncio.wait(senders, timeout=0.1)
    assert not any(s.done() for s in senders)
    got = 0
    end = time.monotonic() + 10
    while got < queued + len(senders):
        assert time.monotonic() < end, f"PID 1 got {got} of {queued + len(senders)}"
        try:
            _, fds, _, _ = socket.recv_fds(ctl.init, 16, 4)
        except BlockingIOError:
            await asyncio.sleep(0.01)
            continue
        for fd in fds:
            os.close(fd)
        got += 1
    done, pending = await asyncio.wait(senders, timeout=10)
    assert not pending
    for s in done:
        s.result()


async def test_a_send_on_a_full_queue_is_bounded_and_survives_close(ctl: _CtlPair) -> None:
    _fill_queue(ctl.host, ctl.fd)
    with pytest.raises(SandboxError):
        await ctl.sender.send(b"r", [ctl.fd], timeout=0.2)
    # Closed while a send waits: that send ends with OSError ("PID 1 is gone"), not a hang.
    waiting = asyncio.ensure_future(ctl.sender.send(b"r", [ctl.fd]))
    await asyncio.wait([waiting], timeout=0.1)
    ctl.sender.close()
    done, _ = await asyncio.wait([waiting], timeout=5)
    assert done and isinstance(waiting.exception(), OSError)


async def test_cancelling_a_send_after_close_raises_nothing_else(ctl: _CtlPair) -> None:
    _fill_queue(ctl.host, ctl.fd)
    waiting = asyncio.ensure_future(ctl.sender.send(b"r", [ctl.fd]))
    await asyncio.wait([waiting], timeout=0.1)
    ctl.sender.close()
    waiting.cancel()
    await asyncio.wait([waiting], timeout=5)
    assert waiting.cancelled() or isinstance(waiting.exception(), OSError)


# -- 5. commands start with SIGPIPE and SIGXFSZ at their defaults ------------------------------------------

@pytest.mark.parametrize("kind", ["docker", "docker-exec"])
async def test_sigpipe_and_sigxfsz_are_default(kind: str, make_backend: Callable[[str], Any]) -> None:
    box = await make_backend(kind)(sandbox_max_file_mb=1).create(SandboxSpec(rollout_id="sigpipe"))
    try:
        code, out, _ = await sh(box, "yes | head -1; echo ${PIPESTATUS[0]}")
        assert (code, out) == (0, "y\n141\n")
        code, out, _ = await sh(box, "head -c 3000000 /dev/zero > big; echo $?")
        assert out == "153\n"  # 128 + SIGXFSZ
        # Machinery commands (PID 1's direct exec, or an engine exec) start with neither ignored either.
        for ignored in ((await sh(box, "grep ^SigIgn: /proc/self/status"))[1],
                        (await box.run_machinery(["grep", "^SigIgn:", "/proc/self/status"]))[1].decode()):
            assert int(ignored.split()[1], 16) & (1 << 12 | 1 << 24) == 0, ignored  # SIGPIPE 13, SIGXFSZ 25
    finally:
        await box.close()


# -- 6. PID 1 starts the forwarder with --detach and trusts its exit code, not a probe -------------------

def test_init_reports_a_forwarder_that_cannot_listen(tmp_path: Path) -> None:
    """A port someone else holds: a connection probe would call that ready; `--detach` exits 1 and init's
    ready message says the forwarder did not start."""
    for name, data in launcher_files().items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "forwarder.py").write_bytes(forwarder_source())
    with contextlib.ExitStack() as stack:
        taken = stack.enter_context(socket.socket())
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        listener = stack.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET))
        listener.bind(str(tmp_path / "ctl.sock"))
        listener.listen(1)
        listener.settimeout(30)
        argv = [sys.executable, "-I", "-S", str(tmp_path / "launcher.py"), "init", "--forward-socket",
                str(tmp_path / "relay.sock"), "--forward-port", str(taken.getsockname()[1]),
                "--ctl", str(tmp_path / "ctl.sock")]
        proc = stack.enter_context(subprocess.Popen(argv))
        stack.callback(proc.kill)
        conn = stack.enter_context(listener.accept()[0])
        conn.settimeout(30)
        error = json.loads(conn.recv(4096))["error"]
    assert error.startswith("the LLM forwarder did not start"), error


# -- 7. only PID 1 takes the control channel -----------------------------------------------------------------

IMPOSTOR = r'''
import json, socket, sys
conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
conn.connect(sys.argv[1])
conn.send(b'{"error": ""}')
print("connected", flush=True)
conn.settimeout(30)
msg, fds, _, _ = socket.recv_fds(conn, 16, 4)
if fds:
    chan = socket.socket(fileno=fds[0])
    while chan.recv(65536):
        pass
    socket.socket(fileno=fds[1]).sendall(b"FORGED\n")
    chan.sendall(b'{"code": 0, "status": null}')
    print("answered", flush=True)
'''


class _RunningContainer:
    """The engine API as `ControlChannel.boot` uses it, for a container that runs (no Docker daemon here: its
    PID 1 is the real launcher's `init`, started by the test on this host)."""

    def start(self, container_id: str) -> None:
        pass

    def inspect_container(self, container_id: str) -> dict[str, Any]:
        return {"State": {"Running": True}}

    def logs(self, container_id: str, tail: int) -> bytes:
        return b""


async def test_a_process_of_the_server_s_uid_cannot_take_init_s_place() -> None:
    """A Landlock-confined process of the server's uid (a sandbox of that tier: it may connect to any unix socket
    of the uid, and /proc/net/unix names them) connects to the control listener before PID 1 and says it is
    ready: it is closed unheard, and the command goes to PID 1 (the real launcher's `init --ctl --ctl-key`)."""
    from coding_agent_env.sandbox.landlock import Policy, confine_argv, system_paths

    with contextlib.ExitStack() as stack:
        state = Path(tempfile.mkdtemp(prefix="cae-ctl-"))  # short: the socket's path must fit in sun_path
        stack.callback(shutil.rmtree, state)
        channel = ControlChannel.prepare(state)
        [host] = state.glob("*-docker-*")
        ctl, key = str(host / "ctl.sock"), str(host / "ctl.key")
        impostor = stack.enter_context(subprocess.Popen(
            confine_argv(Policy(read=system_paths(), write=()), ["/usr/bin/python3", "-c", IMPOSTOR, ctl]),
            stdout=subprocess.PIPE, text=True, env={}))
        stack.callback(impostor.kill)
        assert impostor.stdout is not None and impostor.stdout.readline() == "connected\n"
        init = stack.enter_context(subprocess.Popen(
            [sys.executable, "-I", "-S", str(host / "launcher.py"), "init", "--ctl", ctl, "--ctl-key", key]))
        stack.callback(init.kill)
        try:
            await asyncio.wait_for(channel.boot(_RunningContainer(), "c0ffee", None), 30)
            out, err = OutputCap(4096), OutputCap(4096)
            ran = await asyncio.wait_for(channel.run(["/bin/echo", "from init"], env={"PATH": "/usr/bin:/bin"},
                                                     uid=None, out=out, err=err), 30)
        finally:
            await channel.close()
        assert (ran.code, bytes(out.kept)) == (0, b"from init\n"), (ran, out.kept, err.kept)
        impostor.kill()
        assert "answered" not in impostor.communicate(timeout=10)[0]


async def test_an_attach_cancelled_while_init_s_queue_is_full_keeps_no_socket(ctl: _CtlPair) -> None:
    """Cancelled while its message waits for room in PID 1's queue (or timed out there): the attach's own ends
    of its three socket pairs are closed, not left open for as long as something holds the cancellation."""
    _fill_queue(ctl.host, ctl.fd)
    channel = ControlChannel.over(ctl.host)
    before = len(os.listdir("/proc/self/fd"))
    attaching = asyncio.ensure_future(channel.attach(["true"], env={}, uid=None))
    await asyncio.wait([attaching], timeout=0.2)
    assert not attaching.done()
    attaching.cancel()
    await asyncio.wait([attaching], timeout=10)
    assert attaching.cancelled()
    assert len(os.listdir("/proc/self/fd")) == before
