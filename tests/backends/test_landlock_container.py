"""The Landlock tier where it is meant for: a container run as a Hugging Face Space runs one (uid 1000, the
engine's default seccomp profile and masked /proc paths, no added capability, `--network host`), on the real
dockerd (.ci/run starts one; skipped without one, failed under CI).

The container (the offline test image, the host's /usr bound read-only) plays the server: a process of uid
1000 holding a secret in its environment, a state dir with a secret file, a loopback listener; a command
confined by `confine` as the local backend starts it (same uid, no namespace) must reach none of them, while
its own directory and the system work; and its processes are bounded though it shares the server's uid.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import coding_agent_env.sandbox.landlock as landlock_package
from tests.backends.rootfs import HOST_BINDS, IMAGE

_LANDLOCK_DIR = str(Path(landlock_package.__file__).parent)
_DEADLINE_S = 120

_SCRIPT = r"""
set -u
mkdir -p /tmp/state/box/work /tmp/state/other && echo "$CANARY" > /tmp/state/secret && echo "$CANARY" > /tmp/state/other/f
env -i CANARY_ENV="$CANARY" sleep 300 &
server=$!
python3 -c 'import socket, time; s = socket.create_server(("127.0.0.1", 0)); open("/tmp/state/port", "w").write(str(s.getsockname()[1])); time.sleep(300)' &
listener=$!
while [ ! -s /tmp/state/port ]; do sleep 0.05; done
port=$(cat /tmp/state/port)
cd /tmp/state/box/work
python3 -I -S /landlock/confine.py --read /usr --read /etc --write /tmp/state/box/work -- /bin/sh -c "
  echo own > mine && cat mine
  cat /proc/$server/environ /proc/1/environ /tmp/state/secret /tmp/state/other/f
  kill -0 $server && echo SIGNALLED
  python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", $port), 5); print(\"CONNECTED\")'
  true"
echo "exit=$?"
# Without a uid of its own, a fork bomb's reach is bounded: 10 processes beyond what uid 1000 has now.
python3 -I -S /landlock/confine.py --read /usr --read /etc --nproc-over-uid 10 -- /usr/bin/python3 -c '
import os, signal, time
children = []
for _ in range(40):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    children.append(pid)
print("FORKED", len(children))
for pid in children:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)'
kill $server $listener
"""


def test_a_confined_command_in_a_space_like_container_reaches_nothing_of_the_server(docker_engine: Any) -> None:
    canary = "space-secret-" + secrets.token_hex(8)
    binds = {path: {"bind": path, "mode": "ro"} for path in HOST_BINDS}
    binds[_LANDLOCK_DIR] = {"bind": "/landlock", "mode": "ro"}
    container = docker_engine.containers.run(
        IMAGE, ["/bin/sh", "-c", _SCRIPT], user="1000", network_mode="host", environment={"CANARY": canary},
        volumes=binds, detach=True,
    )
    try:
        status = container.wait(timeout=_DEADLINE_S)
        out = container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)
    assert status["StatusCode"] == 0, out
    lines = out.splitlines()
    assert "own" in lines and "exit=0" in lines, out  # stdout and stderr interleave in the log
    assert canary not in out and "SIGNALLED" not in out and "CONNECTED" not in out, out
    assert out.count("Permission denied") >= 4, out  # both environments, both files; the connection: EPERM
    forked = int(out.split("FORKED ", 1)[1].split()[0])
    assert 1 <= forked <= 10, out
