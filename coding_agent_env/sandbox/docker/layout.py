"""Where things are inside a Docker sandbox: the sandbox paths, the launcher's machinery, the relay socket."""

from __future__ import annotations

from coding_agent_env.sandbox.base import SandboxPaths
from coding_agent_env.sandbox.docker import tar
from coding_agent_env.sandbox.launcher.client import SANDBOX_UID, InnerLayout, forwarder_source, launcher_files

__all__ = ["AGENTS_DIR", "LAYOUT", "PATHS", "RELAY_SOCKET", "code_files", "machinery_tar", "sandbox_dirs",
           "sandbox_links"]

PATHS = SandboxPaths(workdir="/workspace", home="/home/sandbox", tmp="/tmp", logs="/logs", tests="/tests")
LINKS = {"/tests": f"{PATHS.logs}/tests"}
"""Symlinks made at start: `/tests` shows the directory only verify fills (`RolloutRequest.verify_files_root`)."""
LAYOUT = InnerLayout(base="/.coding-agent-env", code="/.coding-agent-env/code")
RELAY_SOCKET = "/run/coding-agent-env-relay.sock"
AGENTS_DIR = "/opt/coding-agent-env/agents"


def code_files() -> dict[str, bytes]:
    """What goes in `LAYOUT.code`: the launcher's files and the LLM forwarder, by name."""
    return {**launcher_files(), "forwarder.py": forwarder_source()}


def sandbox_dirs() -> str:
    """What PID 1 makes at start, in `init --dirs` form: `PATH:UID:OCTAL_MODE,...`."""
    dirs = [(LAYOUT.run_dir, 0, 0o700), (LAYOUT.fresh_dir, 0, 0o711), ("/tmp", 0, 0o1777)]
    dirs += [(path, SANDBOX_UID, 0o755) for path in (PATHS.workdir, PATHS.home, PATHS.logs)]
    return ",".join(f"{path}:{uid}:{mode:o}" for path, uid, mode in dirs)


def sandbox_links() -> str:
    """What PID 1 links at start, in `init --links` form."""
    return ",".join(f"{link}={target}" for link, target in LINKS.items())


def machinery_tar() -> bytes:
    """The code, its run/fresh dirs (root-only) and the sandbox's own directories, to copy in before start."""
    base = LAYOUT.base.lstrip("/")
    code = LAYOUT.code_dir.lstrip("/")
    dirs = {base: (0, 0o755), code: (0, 0o755), f"{base}/run": (0, 0o700), f"{base}/fresh": (0, 0o711)}
    for path in (PATHS.workdir, PATHS.home, PATHS.logs):
        parts = path.strip("/").split("/")
        for i in range(len(parts) - 1):
            dirs.setdefault("/".join(parts[: i + 1]), (0, 0o755))
        dirs["/".join(parts)] = (SANDBOX_UID, 0o755)
    dirs["tmp"] = (0, 0o1777)
    links = {link.lstrip("/"): target for link, target in LINKS.items()}
    return tar.tree_tar(dirs, {f"{code}/{name}": data for name, data in code_files().items()}, links)
