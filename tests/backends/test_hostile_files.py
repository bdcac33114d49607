"""Hostile sandbox output, on every backend (INTEGRITY 31): what an agent leaves at a path the server reads,
writes or removes can neither block the event loop nor be followed out of the sandbox, and a tree of any depth
is removed.

Each attack is one shell command in a real sandbox; a ticker measures the event loop's longest stall while the
server touches what it made.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from coding_agent_env.errors import SandboxFileError, SandboxFileNotFoundError, SandboxFileNotRegularError
from coding_agent_env.sandbox import Sandbox, SandboxSpec
from coding_agent_env.sandbox.base import MAX_READ_BYTES

KINDS = ["local", "local-unisolated", "docker", "docker-exec", "hf", "e2b-fake"]
MAX_STALL_S = 0.5
"""The longest the event loop may go without running the ticker while the server reads hostile output."""


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def box(kind: str, make_backend: Callable[[str], Any], assert_no_leftovers: None) -> AsyncIterator[Sandbox]:
    made = await make_backend(kind)().create(SandboxSpec(rollout_id="hostile"))
    try:
        yield made
    finally:
        await made.close()


async def sh(box: Sandbox, script: str, timeout: float = 60) -> str:
    done = await box.exec([box.shell, "-c", script], timeout=timeout, max_output_bytes=64 * 1024)
    assert done.exit_code == 0, (done.stdout, done.stderr)
    return done.stdout.decode()


class Stalls:
    """The longest gap between the wake-ups of a 10 ms ticker on the running loop."""

    def __init__(self) -> None:
        self.longest = 0.0


@contextlib.asynccontextmanager
async def loop_watched() -> AsyncIterator[Stalls]:
    stalls = Stalls()
    loop = asyncio.get_running_loop()

    async def tick() -> None:
        last = loop.time()
        while True:
            await asyncio.sleep(0.01)
            now = loop.time()
            stalls.longest = max(stalls.longest, now - last)
            last = now

    ticker = asyncio.ensure_future(tick())
    try:
        yield stalls
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker


def log_path(box: Sandbox) -> str:
    return f"{box.paths.logs}/agent/agent.log"


async def test_a_fifo_at_a_read_path_is_not_a_regular_file_and_never_blocks(box: Sandbox) -> None:
    path = log_path(box)
    await sh(box, f"mkdir -p {box.paths.logs}/agent && mkfifo {path}")
    async with loop_watched() as stalls:
        for kwargs in ({"max_bytes": 4096, "tail": True}, {"max_bytes": 10}, {}):
            with pytest.raises(SandboxFileNotRegularError):
                await asyncio.wait_for(box.read_bytes(path, **kwargs), 10)
    assert stalls.longest < MAX_STALL_S, stalls.longest


async def test_a_socket_or_a_directory_is_not_a_regular_file(box: Sandbox) -> None:
    await sh(box, "mkdir adir && python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('sock')\"")
    for path in ("adir", "sock"):
        with pytest.raises(SandboxFileNotRegularError):
            await asyncio.wait_for(box.read_bytes(path, max_bytes=100), 10)


async def test_symlinks_are_never_followed_by_a_read(box: Sandbox) -> None:
    await sh(box, "echo inside > real.txt && ln -s /etc/passwd leak && ln -s real.txt near && "
                  "ln -s ../../../../../../../etc/passwd leak2")
    for path in ("leak", "leak2", "near"):
        with pytest.raises(SandboxFileError) as caught:
            await box.read_bytes(path, max_bytes=4096)
        assert "root:" not in str(caught.value)
    with pytest.raises(SandboxFileNotRegularError):
        await box.read_bytes("near")  # in the sandbox, but a symlink all the same
    assert await box.read_text("real.txt") == "inside\n"


async def test_a_fifo_at_a_written_path_is_replaced_without_blocking(box: Sandbox) -> None:
    path = log_path(box)
    await sh(box, f"mkdir -p {box.paths.logs}/agent && mkfifo {path} && mkfifo fifo.txt")
    async with loop_watched() as stalls:
        await asyncio.wait_for(box.write_bytes(path, b"log line\n"), 10)
        await asyncio.wait_for(box.write_text("fifo.txt", "replaced"), 10)
    assert stalls.longest < MAX_STALL_S, stalls.longest
    assert await box.read_bytes(path) == b"log line\n"
    assert await box.read_text("fifo.txt") == "replaced"
    assert (await sh(box, "test -f fifo.txt && test -f " + path + " && echo regular")) == "regular\n"


@pytest.mark.parametrize("kind", ["local", "docker"], indirect=True)
async def test_a_file_past_the_read_cap_is_refused_not_loaded(box: Sandbox) -> None:
    await sh(box, f"truncate -s {MAX_READ_BYTES + 4096} big.bin && printf end >> big.bin")  # sparse: no disk
    async with loop_watched() as stalls:
        with pytest.raises(SandboxFileError, match="larger than the read cap"):
            await box.read_bytes("big.bin")
        assert await box.read_bytes("big.bin", max_bytes=3, tail=True) == b"end"
    assert stalls.longest < MAX_STALL_S, stalls.longest


def _deep_tree(root: str, depth: int) -> str:
    """A shell command making `root` a tree `depth` directories deep, with a file, a FIFO and a symlink out at
    every hundredth level and the deepest directory unreadable."""
    return ("python3 -c \"import os, sys\n"
            f"os.makedirs('{root}', exist_ok=True); os.chdir('{root}')\n"
            f"for i in range({depth}):\n"
            "    os.mkdir('d'); os.chdir('d')\n"
            "    if i % 100 == 0:\n"
            "        open('f', 'w').write('x'); os.mkfifo('p'); os.symlink('/etc', 'etc')\n"
            "os.chmod('.', 0)\"")


@pytest.mark.parametrize("depth", [3000, 10000])
@pytest.mark.parametrize("kind", ["local", "docker"], indirect=True)
async def test_a_deep_tree_is_removed_whatever_its_depth(box: Sandbox, depth: int) -> None:
    tests = f"{box.paths.logs}/tests"
    await sh(box, _deep_tree(tests, depth), timeout=120)
    async with loop_watched() as stalls:
        await asyncio.wait_for(box.remove(tests), 120)
    assert stalls.longest < MAX_STALL_S, stalls.longest
    with pytest.raises(SandboxFileNotFoundError):
        await box.read_bytes(f"{tests}/d/f")
    assert (await sh(box, f"test -e {tests} || echo gone")) == "gone\n"


@pytest.mark.parametrize("kind", ["local", "local-unisolated", "docker"], indirect=True)
async def test_a_deep_tree_goes_with_the_sandbox(box: Sandbox) -> None:
    await sh(box, _deep_tree(f"{box.paths.workdir}/deep", 3000), timeout=120)
    await asyncio.wait_for(box.close(), 120)  # `assert_no_leftovers` checks that nothing is left


def test_the_tree_remover_stands_alone() -> None:
    """The remover the launcher copies into sandboxes imports nothing of the package (it runs there alone)."""
    from coding_agent_env.sandbox.launcher import client

    source = (client.INSIDE_DIR / "treeops.py").read_text()
    assert "coding_agent_env" not in source.split('"""', 2)[2]
    assert "treeops.py" in client.LAUNCHER_FILES
