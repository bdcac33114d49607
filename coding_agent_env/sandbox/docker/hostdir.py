"""A container's host directory (control transport only), bind-mounted read-only at `LAYOUT.code`.

It holds the launcher's files, the forwarder and the one-shot SOCK_SEQPACKET listener PID 1 connects to, and
the path guard's directory (`GUARD_SUBDIR`, mode 0755: the sandbox's user reads it), bind-mounted read-only on
its own at `GUARD_DIR` (the host directory itself is 0700). It is
owned by this server process (`<pid>-docker-<hex>` under the state dir), so both reapers can remove it after a
crash (the Docker reaper finds it by the container's `LABEL_HOSTDIR`).
"""

from __future__ import annotations

import os
import contextlib
import secrets
import socket
from pathlib import Path

from coding_agent_env.errors import SandboxError
from coding_agent_env.sandbox import pathguard
from coding_agent_env.sandbox.docker.layout import GUARD_SUBDIR, code_files
from coding_agent_env.sandbox.launcher.inside.treeops import remove_tree

__all__ = ["HostDir"]

_SOCKET_PATH_MAX = 100
"""`sun_path` holds 108 bytes: a longer control socket path cannot be bound."""


class HostDir:
    """See the module docstring."""

    SOCKET = "ctl.sock"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.listener: socket.socket | None = None

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
