"""A container's host directory (control transport only), bind-mounted read-only at `LAYOUT.code`.

It holds the launcher's files, the forwarder and the one-shot SOCK_SEQPACKET listener PID 1 connects to, and
the path guard's directory (`GUARD_SUBDIR`, mode 0755: the sandbox's user reads it), bind-mounted read-only on
its own at `GUARD_DIR` (the host directory itself is 0700). It is
owned by this server process (`<pid>-docker-<hex>` under the state dir), so both reapers can remove it after a
crash (the Docker reaper finds it by the container's `LABEL_HOSTDIR`).
"""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import secrets
import socket
from pathlib import Path

from coding_agent_env.errors import SandboxError
from coding_agent_env.sandbox import pathguard
from coding_agent_env.sandbox.docker.layout import GUARD_SUBDIR, code_files
from coding_agent_env.sandbox.launcher.inside.treeops import remove_tree

__all__ = ["HostDir"]

_KEY_BYTES = 16
"""Random bytes of the control key (`HostDir.KEY`)."""
_SOCKET_PATH_MAX = 100
"""`sun_path` holds 108 bytes: a longer control socket path cannot be bound."""


class HostDir:
    """See the module docstring."""

    SOCKET = "ctl.sock"
    KEY = "ctl.key"
    """PID 1 reads it (`--ctl-key`) and says it in its ready message (`proves`): the listener's path can be reached
    by other processes of this host (a Landlock-tier sandbox has the server's uid, and /proc/net/unix names every
    listener), this file only by root and the server."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.listener: socket.socket | None = None
        self.key = secrets.token_hex(_KEY_BYTES)

    def proves(self, hello: bytes) -> bool:
        """Whether a ready message carries this directory's key (compared in constant time)."""
        try:
            said = json.loads(hello)
        except ValueError:
            return False
        key = said.get("key") if isinstance(said, dict) else None
        return isinstance(key, str) and hmac.compare_digest(key.encode(), self.key.encode())

    @property
    def guard(self) -> Path:
        """The path guard's host directory."""
        return self.path / GUARD_SUBDIR

    @staticmethod
    def fits(state_dir: Path) -> bool:
        """Whether a control socket under `state_dir` fits in a unix socket address."""
        return len(str(state_dir / f"{os.getpid()}-docker-{'0' * 12}" / HostDir.SOCKET)) <= _SOCKET_PATH_MAX

    @classmethod
    def make(cls, state_dir: Path) -> HostDir:
        """A fresh host dir with its files and its listener bound (see `fits`); `SandboxError` if it cannot."""
        path = state_dir / f"{os.getpid()}-docker-{secrets.token_hex(6)}"
        if len(str(path / cls.SOCKET)) > _SOCKET_PATH_MAX:
            raise SandboxError(f"the control socket path under {state_dir} is too long for a unix socket")
        state_dir.mkdir(parents=True, exist_ok=True)
        made = cls(path)
        try:
            path.mkdir(mode=0o700)
            for name, data in code_files().items():
                (path / name).write_bytes(data)
            (path / cls.KEY).write_text(made.key)  # the directory is 0700: root and this server alone read it
            made.guard.mkdir()
            for name, data in pathguard.files().items():
                (made.guard / name).write_bytes(data)
                os.chmod(made.guard / name, 0o644)
            os.chmod(made.guard, 0o755)  # whatever the umask: the sandbox's user reads it
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            made.listener = listener
            listener.bind(str(path / cls.SOCKET))
            listener.listen(1)
            listener.setblocking(False)
        except OSError as exc:
            made.remove()
            raise SandboxError(f"cannot prepare the container's host directory: {exc.strerror}") from exc
        return made

    def close_listener(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None
            (self.path / self.SOCKET).unlink(missing_ok=True)

    def remove(self) -> None:
        self.close_listener()
        with contextlib.suppress(OSError):  # left to the reapers
            remove_tree(self.path)
