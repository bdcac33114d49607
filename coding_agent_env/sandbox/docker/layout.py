"""Where things are inside a Docker sandbox: the sandbox paths, the launcher's machinery, the relay socket, and
one sandbox's own layout (`SandboxLayout`: the workdir, the task's further writable roots, `/tests`)."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from coding_agent_env.errors import SandboxUnsupportedError
from coding_agent_env.sandbox import pathguard
from coding_agent_env.sandbox.base import SandboxPaths, SandboxSpec
from coding_agent_env.sandbox.docker import tar
from coding_agent_env.sandbox.launcher.client import SANDBOX_UID, InnerLayout, forwarder_source, launcher_files

__all__ = [
    "AGENTS_DIR", "DEFAULT", "GUARD_DIR", "GUARD_SUBDIR", "LAYOUT", "PATHS", "RELAY_SOCKET", "TESTS", "SandboxLayout",
    "code_files",
]

PATHS = SandboxPaths(workdir="/workspace", home="/home/sandbox", tmp="/tmp", logs="/logs")
"""A sandbox's paths when its spec names no workdir and no hidden tests."""
TESTS = "/tests"
"""Shown (`SandboxSpec.tests`) as a symlink to `{logs}/tests`, the directory only verify fills
(`RolloutRequest.verify_files_root`)."""
LAYOUT = InnerLayout(base="/.coding-agent-env", code="/.coding-agent-env/code")
RELAY_SOCKET = "/run/coding-agent-env-relay.sock"
AGENTS_DIR = "/opt/coding-agent-env/agents"
GUARD_SUBDIR = "verify-site"
GUARD_DIR = f"{LAYOUT.base}/{GUARD_SUBDIR}"
"""The path guard's directory (`Sandbox.path_guard`): root's, read-only to the sandbox's user (a read-only mount
with the control transport, a root-owned directory copied in with the exec transport)."""
_SYSTEM = ("/proc", "/sys", "/dev", "/usr", "/etc", "/bin", "/sbin", "/lib", "/lib64", "/run")
"""Where no task's directory can be shown: the kernel's, the image's programs (the test image binds the host's
/usr there), the engine's own files."""


def code_files() -> dict[str, bytes]:
    """What goes in `LAYOUT.code`: the launcher's files and the LLM forwarder, by name."""
    return {**launcher_files(), "forwarder.py": forwarder_source()}


def _overlaps(a: str, b: str) -> bool:
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


@dataclass(frozen=True)
class SandboxLayout:
    """One sandbox's directories: its `paths` (the workdir where the spec puts it, `/tests` only with
    `SandboxSpec.tests`) and the task's further writable `roots` (`SandboxSpec.writable_roots`), each made a
    directory owned by the sandbox user."""

    paths: SandboxPaths
    roots: tuple[str, ...] = ()

    @classmethod
    def of(cls, spec: SandboxSpec) -> SandboxLayout:
        """The layout `spec` asks for; `SandboxUnsupportedError` (naming `workdir` or `writable_roots`) for a
        directory this backend cannot show where asked (on the sandbox's own, the system's, or another's)."""
        own = (PATHS.home, PATHS.tmp, PATHS.logs, LAYOUT.base, TESTS, AGENTS_DIR, *_SYSTEM)
        workdir = PATHS.workdir
        if spec.workdir is not None:
            workdir = _claimable(spec.workdir, "workdir", own)
        roots: list[str] = []
        for root in spec.writable_roots:
            root = _claimable(root, "writable_roots", (*own, workdir, *roots))
            roots.append(root)
        paths = SandboxPaths(workdir=workdir, home=PATHS.home, tmp=PATHS.tmp, logs=PATHS.logs,
                             tests=TESTS if spec.tests else None)
        return cls(paths, tuple(roots))

    @property
    def links(self) -> dict[str, str]:
        """Symlinks made at start: `/tests` to the directory only verify fills, when the spec shows it."""
        return {TESTS: f"{self.paths.logs}/tests"} if self.paths.tests is not None else {}

    @property
    def owned(self) -> tuple[str, ...]:
        """The directories owned by the sandbox user: its own, then the task's further roots."""
        return (self.paths.workdir, self.paths.home, self.paths.logs, *self.roots)

    def dirs(self) -> str:
        """What PID 1 makes at start, in `init --dirs` form: `PATH:UID:OCTAL_MODE,...`."""
        dirs = [(LAYOUT.run_dir, 0, 0o700), (LAYOUT.fresh_dir, 0, 0o711), ("/tmp", 0, 0o1777)]
        dirs += [(path, SANDBOX_UID, 0o755) for path in self.owned]
        return ",".join(f"{path}:{uid}:{mode:o}" for path, uid, mode in dirs)

    @staticmethod
    def owned_dirs(paths: tuple[str, ...]) -> str:
        """`paths` as the sandbox user's directories, in `init --dirs` (and the launcher's `dirs`) form."""
        return ",".join(f"{path}:{SANDBOX_UID}:755" for path in paths)

    def links_arg(self) -> str | None:
        """What PID 1 links at start, in `init --links` form; None when nothing."""
        return ",".join(f"{link}={target}" for link, target in self.links.items()) or None

    def machinery_tar(self) -> bytes:
        """The code, its run/fresh dirs (root-only), the path guard and the sandbox's own directories, to copy in
        before start."""
        base = LAYOUT.base.lstrip("/")
        code = LAYOUT.code_dir.lstrip("/")
        guard = GUARD_DIR.lstrip("/")
        dirs = {base: (0, 0o755), code: (0, 0o755), f"{base}/run": (0, 0o700), f"{base}/fresh": (0, 0o711),
                guard: (0, 0o755)}
        for path in self.owned:
            parts = path.strip("/").split("/")
            for i in range(len(parts) - 1):
                dirs.setdefault("/".join(parts[: i + 1]), (0, 0o755))
            dirs["/".join(parts)] = (SANDBOX_UID, 0o755)
        dirs["tmp"] = (0, 0o1777)
        links = {link.lstrip("/"): target for link, target in self.links.items()}
        files = {f"{code}/{name}": data for name, data in code_files().items()}
        files |= {f"{guard}/{name}": data for name, data in pathguard.files().items()}
        return tar.tree_tar(dirs, files, links)


def _claimable(path: str, setting: str, taken: tuple[str, ...]) -> str:
    """`path`, normalised, if a directory of the task's can be shown there; else `SandboxUnsupportedError`."""
    normal = posixpath.normpath(path) if path.startswith("/") else ""
    if not normal or normal == "/" or normal.startswith("//") or "\x00" in normal:
        raise SandboxUnsupportedError("docker", setting, f"{path[:100]!r} is not an absolute path below /")
    if any(ch in normal for ch in ",:="):
        # The init's directory list (`PATH:UID:MODE,...`) carries our own paths: no separators in them.
        raise SandboxUnsupportedError("docker", setting, f"{path[:100]!r}: ',', ':' and '=' are not supported")
    for other in taken:
        if _overlaps(normal, other):
            raise SandboxUnsupportedError("docker", setting, f"{normal!r} overlaps {other!r}, which is not the task's")
    return normal


DEFAULT = SandboxLayout(PATHS)
"""The layout of a spec that names no workdir, no further roots and no hidden tests."""
