"""The sandbox contract, run against every backend: local (bubblewrap, and its unisolated fallback), docker
(a real dockerd, .ci/run starts one), hf (hf-sandbox's own in-pod server run on loopback), e2b (a fake of
its SDK: the E2B cloud is unreachable here; see tests/fakes/e2b_fake.py) and k8s (a stand-in for a Kubernetes
cluster with agent-sandbox whose pods are network-less containers on the real dockerd: tests/fakes/k8s_standin.py).

A case that needs what a backend's stand-in cannot give (a VM boundary, a pod network) is skipped for it with
that reason.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from coding_agent_env.errors import SandboxClosedError, SandboxFileError, SandboxFileNotFoundError, SandboxUnavailableError
from coding_agent_env.sandbox import Sandbox, SandboxSpec
from coding_agent_env.sandbox.base import RelayEndpoint
from coding_agent_env.sandbox.docker import DockerSandbox
from coding_agent_env.settings import Settings
from tests.backends.conftest import forwarder_source_path, processes
from tests.helpers import poll, relay_port_refused

OUT = 64 * 1024
BACKENDS = ["local", "local-unisolated", "local-landlock", "docker", "docker-exec", "hf", "e2b-fake", "k8s"]
"""Backend kinds (see conftest `make_backend`); `docker-exec` is Docker's mode for a daemon not on this host."""
STAND_INS = {"hf": "the hf-sandbox server runs on this host, not in a pod", "e2b-fake": "the e2b fake runs commands on this host, not in a VM"}


@pytest.fixture(params=BACKENDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def sandbox(kind: str, make_backend: Callable[[str], Any], assert_no_leftovers: None) -> AsyncIterator[Sandbox]:
    box = await make_backend(kind)().create(SandboxSpec(rollout_id="contract"))
    if kind == "local-unisolated":
        assert box.isolation == "none"
    if kind == "local-landlock":
        assert box.isolation == "landlock"
    if isinstance(box, DockerSandbox):
        assert box.transport.name == ("exec" if kind == "docker-exec" else "control"), "not the transport under test"
    try:
        yield box
    finally:
        await box.close()


@pytest.fixture
def live(request: pytest.FixtureRequest, kind: str, settings: Settings) -> Callable[[Sandbox], list[str]]:
    engine = request.getfixturevalue("docker_engine") if kind.startswith("docker") or kind == "k8s" else None
    return lambda box: processes(box, settings, engine)


def isolated(box: Sandbox, kind: str = "") -> None:
    if kind in STAND_INS:
        pytest.skip(STAND_INS[kind])
    if box.isolation == "none":
        pytest.skip("this sandbox runs unisolated (bubblewrap unavailable or disabled)")


async def sh(box: Sandbox, script: str, timeout: float = 20, **kw: object) -> tuple[int | None, str, str]:
    done = await box.exec([box.shell, "-c", script], timeout=timeout, max_output_bytes=OUT, **kw)  # type: ignore[arg-type]
    return done.exit_code, done.stdout.decode(), done.stderr.decode()


async def test_exec_output_exit_code_env_cwd(sandbox: Sandbox) -> None:
    await sandbox.mkdir("sub/dir")
    code, out, err = await sh(sandbox, 'echo "$GREETING"; pwd; echo oops >&2; exit 7', env={"GREETING": "hi there"}, cwd=f"{sandbox.paths.workdir}/sub/dir")
    assert (code, out, err) == (7, f"hi there\n{sandbox.paths.workdir}/sub/dir\n", "oops\n")


async def test_exec_env_is_not_the_servers(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVER_SECRET", "sk-must-not-leak")
    _, out, _ = await sh(sandbox, "env")
    assert "sk-must-not-leak" not in out
    assert f"HOME={sandbox.paths.home}" in out


async def test_the_specs_env_reaches_every_command(kind: str, make_backend: Callable[[str], Any],
                                                    assert_no_leftovers: None) -> None:
    """`SandboxSpec.env` (a task's variables) is in every command's environment, the fresh context's too; the
    sandbox's own HOME stays; the caller's `env` wins over it."""
    spec = SandboxSpec(rollout_id="env", env={"TASK_VAR": "from the task", "PATH": "/opt/task/bin:/usr/bin:/bin",
                                              "HOME": "/not/the/home"})
    box = await make_backend(kind)().create(spec)
    try:
        for fresh in (False, True):
            _, out, _ = await sh(box, 'echo "$TASK_VAR|$PATH|$HOME"', fresh=fresh)
            assert out.split("|")[:2] == ["from the task", "/opt/task/bin:/usr/bin:/bin"], out
            assert not out.endswith("|/not/the/home\n"), out
        _, out, _ = await sh(box, 'echo "$TASK_VAR"', env={"TASK_VAR": "the caller's"})
        assert out == "the caller's\n"
    finally:
        await box.close()


async def test_timeout_kills_the_whole_tree(sandbox: Sandbox, live: Callable[[Sandbox], list[str]]) -> None:
    script = "(trap '' TERM; sleep 300) & (setsid sleep 301 &) ; sleep 302"
    done = await sandbox.exec([sandbox.shell, "-c", script], timeout=0.5, max_output_bytes=OUT)
    assert done.timed_out and done.exit_code is not None and done.exit_code < 0
    if sandbox.isolation != "none" or sandbox.backend != "local":
        assert not [p for p in live(sandbox) if "sleep 30" in p]


async def test_commands_start_with_default_sigpipe_and_sigxfsz(sandbox: Sandbox) -> None:
    """Python ignores both; a command started through Python must not inherit that (`yes | head -1`)."""
    code, out, _ = await sh(sandbox, "yes | head -1; echo ${PIPESTATUS[0]}; grep ^SigIgn: /proc/self/status")
    lines = out.splitlines()
    assert code == 0 and lines[:2] == ["y", "141"], out
    assert int(lines[2].split()[1], 16) & (1 << 12 | 1 << 24) == 0, out  # SIGPIPE 13, SIGXFSZ 25


async def test_files_bytes_text_parents_and_special_names(sandbox: Sandbox) -> None:
    name = "dir with space/ünï'cödé \"$(x)\"; `y`.txt"
    payload = bytes(range(256)) * 10
    await sandbox.write_bytes(f"a/b/{name}", payload)
    assert await sandbox.read_bytes(f"a/b/{name}") == payload
    await sandbox.write_text("t.txt", "line $(touch pwned)\n")
    code, out, _ = await sh(sandbox, "cat t.txt; ls pwned 2>/dev/null; find a/b -type f")
    assert out == f"line $(touch pwned)\na/b/{name}\n"
    assert await sandbox.read_text("t.txt", max_bytes=4) == "line"
    assert await sandbox.read_text("t.txt", max_bytes=4, tail=True) == "ed)\n"
    big = bytes(range(256)) * 4096  # bounded reads of a large binary file: exactly the slice asked for
    await sandbox.write_bytes("big.bin", big)
    assert await sandbox.read_bytes("big.bin", max_bytes=1000) == big[:1000]
    assert await sandbox.read_bytes("big.bin", max_bytes=1000, tail=True) == big[-1000:]
    assert await sandbox.read_bytes("big.bin", max_bytes=len(big) + 1, tail=True) == big


async def test_missing_files_and_escapes(sandbox: Sandbox) -> None:
    with pytest.raises(SandboxFileNotFoundError):
        await sandbox.read_bytes("nope.txt")
    with pytest.raises(SandboxFileError):
        await sandbox.read_bytes("/etc/passwd")
    await sh(sandbox, "ln -s /etc/passwd leak; ln -s ../../../../../../etc/passwd leak2")
    for path in ("leak", "leak2"):
        with pytest.raises(SandboxFileError):
            await sandbox.read_bytes(path)
    await sandbox.write_text("leak", "replaced, not followed")
    assert await sandbox.read_text("leak") == "replaced, not followed"
    await sandbox.remove("nope-either")  # missing is fine


async def test_list_files_does_not_follow_symlinks(sandbox: Sandbox) -> None:
    await sandbox.write_text("x/y.txt", "1")
    await sh(sandbox, "ln -s / root-link")
    entries, cut = await sandbox.list_files(".", max_entries=100)
    kinds = {e.path: e.kind for e in entries}
    assert kinds == {"root-link": "symlink", "x": "dir", "x/y.txt": "file"} and not cut


async def test_background_wait_and_kill(sandbox: Sandbox, live: Callable[[Sandbox], list[str]]) -> None:
    proc = await sandbox.spawn([sandbox.shell, "-c", "echo started; exit 3"], log_path=f"{sandbox.paths.logs}/p.log")
    assert await proc.wait() == 3
    assert await sandbox.read_text(f"{sandbox.paths.logs}/p.log") == "started\n"
    proc = await sandbox.spawn([sandbox.shell, "-c", "(trap '' TERM; sleep 300) & sleep 300"])
    assert proc.returncode is None
    await proc.kill()
    await proc.kill()  # idempotent
    assert proc.returncode is not None
    assert not [p for p in live(sandbox) if "sleep 300" in p]


async def test_close_is_idempotent_and_final(sandbox: Sandbox) -> None:
    await sandbox.close()
    await sandbox.close()
    with pytest.raises(SandboxClosedError):
        await sh(sandbox, "true")


async def test_close_during_running_exec(sandbox: Sandbox, live: Callable[[Sandbox], list[str]]) -> None:
    running = asyncio.ensure_future(sh(sandbox, "sleep 303", timeout=300))
    await poll(lambda: any("sleep 303" in p for p in live(sandbox)))
    await sandbox.close()
    code, _, _ = await asyncio.wait_for(running, 10)
    assert code is not None and code != 0


async def test_concurrent_sandboxes_cannot_see_each_other(sandbox: Sandbox, kind: str, make_backend: Callable[[str], Any]) -> None:
    isolated(sandbox, kind)
    other = await make_backend(kind)().create(SandboxSpec(rollout_id="other"))
    try:
        await other.write_text("secret.txt", "other's")
        await other.spawn([other.shell, "-c", "sleep 300"])
        _, out, _ = await sh(sandbox, f"ls {sandbox.paths.workdir}; ps -e -o comm=; cat /proc/*/cmdline 2>/dev/null | tr '\\0' ' '")
        assert "secret.txt" not in out and "sleep" not in out
        _, out, _ = await sh(sandbox, f"ls {other.paths.workdir}/.. 2>&1; find / -name secret.txt 2>/dev/null")
        assert "secret.txt" not in out
    finally:
        await other.close()


async def test_network_none_cannot_reach_host_loopback(sandbox: Sandbox, kind: str) -> None:
    isolated(sandbox, kind)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        code, out, _ = await sh(sandbox, f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 2); print('connected')\"")
        assert code != 0 and "connected" not in out
    finally:
        listener.close()


async def test_memory_hog_is_killed(kind: str, make_backend: Callable[[str], Any], assert_no_leftovers: None) -> None:
    box = await make_backend(kind)(sandbox_memory_mb=256).create(SandboxSpec(rollout_id="hog"))
    try:
        code, _, err = await sh(box, "python3 -c 'x = bytearray(1024 * 1024 * 1024); print(len(x))'")
        assert code != 0 and "MemoryError" in err
    finally:
        await box.close()


async def test_fork_bomb_is_contained(kind: str, make_backend: Callable[[str], Any], assert_no_leftovers: None) -> None:
    if kind in STAND_INS:
        pytest.skip(f"{STAND_INS[kind]}: its process limit is the engine's, which the stand-in cannot give")
    box = await make_backend(kind)(sandbox_max_processes=64).create(SandboxSpec(rollout_id="bomb"))
    try:
        if box.isolation == "none" and os.geteuid() != 0:
            pytest.skip("process limits need bubblewrap or root")
        done = await box.exec([box.shell, "-c", "bomb() { bomb | bomb & }; bomb; sleep 3; echo survived"], timeout=30, max_output_bytes=OUT)
        assert done.exit_code is not None and not done.timed_out
        code, out, _ = await sh(box, "echo still usable")
        assert out == "still usable\n"
    finally:
        await box.close()


async def test_file_size_limit_holds(kind: str, make_backend: Callable[[str], Any], assert_no_leftovers: None) -> None:
    box = await make_backend(kind)(sandbox_max_file_mb=1).create(SandboxSpec(rollout_id="fsize"))
    try:
        code, _, _ = await sh(box, "head -c 3000000 /dev/zero > big")
        entries, _ = await box.list_files(".", max_entries=10)
        assert code != 0 and [e.size for e in entries if e.path == "big"] == [1024 * 1024]
    finally:
        await box.close()


@pytest.mark.parametrize("served", [False, True], ids=["socket", "served"])
async def test_llm_policy_reaches_only_the_relay(
    kind: str, served: bool, make_backend: Callable[[str], Any], assert_no_leftovers: None
) -> None:
    """Under `llm` a spawned process reaches the relay at `relay_url`, and nothing else; `exec` (setup,
    verify) does not reach it. `served`: the relay also offers `serve` (serving on a listening socket the
    backend makes, as the real relay does); a backend that uses it stops serving by close()."""
    sock_dir = Path(tempfile.mkdtemp(prefix="cae-relay-"))  # not pytest's 0700 tmp: sandbox uids must reach it
    os.chmod(sock_dir, 0o755)
    relay = await asyncio.start_unix_server(_answer_pong, path=str(sock_dir / "relay.sock"))
    os.chmod(sock_dir / "relay.sock", 0o666)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    servers: list[asyncio.Server] = []
    # The relay's own loopback listener (`Relay.base_url`): what an unisolated or Landlock sandbox reaches.
    tcp_relay = await asyncio.start_server(_answer_pong, "127.0.0.1", 0)
    tcp_url = f"http://127.0.0.1:{tcp_relay.sockets[0].getsockname()[1]}/v1"

    async def serve(sock: socket.socket) -> Callable[[], Awaitable[None]]:
        server = await asyncio.start_server(_answer_pong, sock=sock)
        servers.append(server)

        async def stop() -> None:
            server.close()
            await server.wait_closed()

        return stop

    endpoint = RelayEndpoint(str(sock_dir / "relay.sock"), tcp_url, forwarder_source_path(),
                             serve=serve if served else None)
    spec = SandboxSpec(rollout_id="llm", network="llm", relay=endpoint)
    try:
        try:
            box = await make_backend(kind)().create(spec)
        except SandboxUnavailableError as exc:
            pytest.skip(f"{kind} declares no llm network policy: {exc}")
        try:
            if box.isolation == "none":
                pytest.skip("unisolated: the relay is reached at its TCP URL and nothing else can be blocked")
            assert box.relay_url is not None and box.relay_url.startswith("http://127.0.0.1:")
            probe = (f"import urllib.request,socket; print(urllib.request.urlopen('{box.relay_url}/ping', timeout=5).read().decode());"
                     f"socket.create_connection(('127.0.0.1', {listener.getsockname()[1]}), 2)")
            proc = await box.spawn(["python3", "-c", probe], log_path=f"{box.paths.logs}/probe.log")
            code = await asyncio.wait_for(proc.wait(), 30)
            log = await box.read_text(f"{box.paths.logs}/probe.log")
            assert "pong" in log and code != 0, log
            if kind.startswith("local"):
                # The local backend serves the relay only to spawned commands (Docker's forwarder serves the
                # whole container, and the token is what keeps setup and verify out there).
                assert await relay_port_refused(box), "an exec'd command reached the relay port, or could not try"
        finally:
            await box.close()
        if kind == "local" and served and os.geteuid() == 0:
            assert servers, "as root the local backend serves the relay in the agent's own namespace"
        assert all(not server.is_serving() for server in servers), "close() left the relay serving a sandbox"
    finally:
        listener.close()
        for server in (relay, tcp_relay):
            server.close()
            await server.wait_closed()
        shutil.rmtree(sock_dir)


async def _answer_pong(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\nconnection: close\r\n\r\npong")
    await writer.drain()
    writer.close()
