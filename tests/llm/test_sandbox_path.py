"""An agent in a network-less bubblewrap namespace reaches the relay over its bind-mounted unix socket.

Uses bwrap directly (the local backend's `llm` network policy is not built yet): `--unshare-all` leaves only
`lo`; the relay socket is bound at /run/llm.sock and `llm/forwarder.py` maps 127.0.0.1:8765 onto it. The
token reaches the sandboxed client on stdin, never argv or env, and the upstream key never enters at all.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import pytest

import coding_agent_env.llm.forwarder as forwarder_module
from coding_agent_env.llm import Relay
from tests.fakes.llm import FakeLLMServer, Reply
from tests.llm.conftest import SERVER_KEY, upstream_for

BWRAP = shutil.which("bwrap")
PORT = 8765
CLIENT = r"""
import json, subprocess, sys, time, urllib.request
token = sys.stdin.readline().strip()
fwd = subprocess.Popen([sys.executable, "/run/forwarder.py", "/run/llm.sock", "8765"])
body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
deadline = time.monotonic() + 10
while True:
    try:
        req = urllib.request.Request("http://127.0.0.1:8765/v1/chat/completions", data=body,
                                     headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
        print(json.loads(urllib.request.urlopen(req, timeout=5).read())["choices"][0]["message"]["content"])
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.02)
try:
    urllib.request.urlopen("http://example.com", timeout=2)
    print("NETWORK")
except OSError:
    print("no network")
fwd.kill()
"""


def _system_args() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    for top in ("/bin", "/sbin", "/lib", "/lib64"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    return args


@pytest.mark.skipif(BWRAP is None, reason="bubblewrap is not installed")
async def test_networkless_sandbox_reaches_relay_through_unix_socket(relay: Relay, fake: FakeLLMServer) -> None:
    fake.app.script = [Reply(content="from the model")]
    lease = await relay.open_lease("sandboxed", upstream_for(fake))
    argv = [BWRAP, "--unshare-all", "--die-with-parent", "--new-session", *_system_args(),
            "--bind", str(lease.socket_path), "/run/llm.sock",
            "--ro-bind", str(Path(forwarder_module.__file__)), "/run/forwarder.py",
            "--", "/usr/bin/python3", "-c", CLIENT]
    proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE, env={"PATH": "/usr/bin:/bin"},
                                                start_new_session=True)
    try:
        async with asyncio.timeout(30):
            out, err = await proc.communicate((lease.token + "\n").encode())
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, 9)
            await proc.wait()
    assert proc.returncode == 0, err.decode()
    assert out.decode().split("\n")[:2] == ["from the model", "no network"]
    assert lease.token not in " ".join(argv) and SERVER_KEY not in " ".join(argv)
    [turn] = lease.turns()
    assert turn.message.content == "from the model"
    assert fake.app.requests[-1].headers["authorization"] == f"Bearer {SERVER_KEY}"
    assert SERVER_KEY not in json.dumps(turn.model_dump(mode="json"))
