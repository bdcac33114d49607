"""The built-in Terminus agent, as a `CliAgentSpec` the generic driver runs.

Design: the loop (`terminus.loop`, standard library only) runs *inside* the sandbox, as a Python process the
driver spawns like any CLI agent. So it gets exactly what OpenCode and Pi get: the relay at the sandbox's
relay URL with the per-rollout token (its turns are recorded like any agent's), the same deadline and the
same process-tree kill, and no access to the server. Its commands run next to it with persistent shell state
(`terminus.shell`). Nothing is installed: the three modules are written into the agent dir per rollout
(a few KB) and run with the sandbox's own `python3 -I -S -B` (no site: only the standard library is needed;
no bytecode written: the agent dir is fresh per rollout).

Start-up is on every rollout's critical path, so the modules also ship compiled, as PEP 552 checked-hash
`.pyc` files under `__pycache__` tagged with this server's `sys.implementation.cache_tag`: a sandbox Python
of the same version imports them without compiling (its import system checks the source hash, so a pyc can
never run stale code); any other Python ignores them and compiles the sources as usual.

Where the sandbox sees the host's agents dir (read-only; the local and Docker backends), the package is
written there once per server version instead, as `terminus-<version>-<digest of the files>/` (made whole
in a temporary sibling, then renamed into place), and each rollout writes only its config: fewer files to
write at the start and to remove at the end. Elsewhere, or when the agents dir is not writable, the files
go into the agent dir as above.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import logging
import marshal
import os
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from coding_agent_env.agents.driver import CliAgent
from coding_agent_env.agents.events import AgentReport, json_lines
from coding_agent_env.agents.spec import AgentFile, CliAgentSpec, Launch, LaunchContext
from coding_agent_env.settings import Settings

__all__ = ["TERMINUS", "TerminusAgent", "TerminusConfig", "parse_terminus_events", "shared_package"]

log = logging.getLogger(__name__)

VERSION = "1.0.0"
_SHIPPED = ("parse.py", "shell.py", "loop.py")
_PACKAGE = "terminus_agent"
_BOOT = "import sys; sys.path.insert(0, sys.argv[1]); from terminus_agent.loop import main; sys.exit(main(sys.argv[2:]))"
"""A constant program: its arguments (package dir, config path) carry no secret and no instruction."""


@dataclass(frozen=True)
class TerminusConfig:
    """The loop's limits, from `Settings.terminus_*` (defined there, once)."""

    max_turns: int
    command_timeout_s: float
    max_output_bytes: int
    llm_timeout_s: float
    loose_parsing: bool

    @classmethod
    def from_settings(cls, settings: Settings) -> TerminusConfig:
        return cls(
            max_turns=settings.terminus_max_turns,
            command_timeout_s=settings.terminus_command_timeout_s,
            max_output_bytes=settings.terminus_max_output_bytes,
            llm_timeout_s=settings.terminus_llm_timeout_s,
            loose_parsing=settings.terminus_loose_parsing,
        )


_PYC_FLAGS = 0b11
"""PEP 552 flags: hash-based, and checked against the source on import."""


def _pyc(source: bytes, name: str) -> bytes:
    """A checked-hash pyc of `source` for this interpreter (PEP 552 layout: magic, flags, hash, code).
    The code's file name does not matter: the importer sets it to where the source really is."""
    code = compile(source, name, "exec", dont_inherit=True)
    header = importlib.util.MAGIC_NUMBER + _PYC_FLAGS.to_bytes(4, "little") + importlib.util.source_hash(source)
    return header + marshal.dumps(code)


@functools.cache
def _compiled() -> tuple[tuple[str, str, str | None], ...]:
    """(module file name, source, pyc as latin-1 text or None) of each shipped module, compiled once per server."""
    here = Path(__file__).parent
    shipped = []
    for name in _SHIPPED:
        source = (here / name).read_bytes()
        pyc = _pyc(source, name).decode("latin-1") if sys.implementation.cache_tag is not None else None
        shipped.append((name, source.decode("utf-8"), pyc))
    return tuple(shipped)


def _package_files(package_dir: str) -> list[AgentFile]:
    """The package's files under `package_dir` (a sandbox path): sources, and their pycs when possible."""
    files = [AgentFile(f"{package_dir}/__init__.py", "", mode=0o644)]
    for name, source, pyc in _compiled():
        files.append(AgentFile(f"{package_dir}/{name}", source, mode=0o644))
        if pyc is not None:
            cached = f"{package_dir}/__pycache__/{name.removesuffix('.py')}.{sys.implementation.cache_tag}.pyc"
            files.append(AgentFile(cached, pyc, mode=0o644, encoding="latin-1"))
    return files


@functools.cache
def _digest() -> str:
    """Identifies the package's files (sources, and pycs for this interpreter)."""
    hasher = hashlib.sha256(str(sys.implementation.cache_tag).encode())
    for item in _package_files(_PACKAGE):
        hasher.update(item.path.encode() + b"\0" + item.data() + b"\0")
    return hasher.hexdigest()[:16]


_shared: dict[Path, str | None] = {}
"""Per agents dir: the package's directory name there, or None when it could not be made."""


def shared_package(agents_dir: Path) -> str | None:
    """The name of a directory under `agents_dir` holding this server's exact package (made on the first call
    when missing), or None when there is none and it cannot be made (no such dir, not writable)."""
    name = _shared.get(agents_dir)
    if name is None or not (agents_dir / name).is_dir():  # checked each time: an operator may clear the dir
        name = _shared[agents_dir] = _install_shared(agents_dir)
    return name


def _install_shared(agents_dir: Path) -> str | None:
    name = f"terminus-{VERSION}-{_digest()}"
    if (agents_dir / name).is_dir():
        return name
    if not agents_dir.is_dir() or not os.access(agents_dir, os.W_OK):
        return None
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=agents_dir))
    except OSError:
        return None
    try:
        for item in _package_files(str(staging / _PACKAGE)):
            os.makedirs(os.path.dirname(item.path), mode=0o755, exist_ok=True)
            with open(item.path, "wb") as handle:
                handle.write(item.data())
            os.chmod(item.path, 0o644)
        for directory, _, _ in os.walk(staging):
            os.chmod(directory, 0o755)  # sandboxes run as other uids and must read it
        try:
            staging.rename(agents_dir / name)
        except OSError:
            if not (agents_dir / name).is_dir():  # else another server process made it first: same bytes
                raise
    except OSError as exc:
        log.warning("cannot write the Terminus package under %s: %s", agents_dir, exc)
        return None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return name


def render(ctx: LaunchContext) -> Launch:
    config = TerminusConfig.from_settings(ctx.settings)
    shared = shared_package(ctx.settings.agents_dir) if ctx.agents_root is not None else None
    if shared is not None:
        package_root, files = f"{ctx.agents_root}/{shared}", list[AgentFile]()
    else:
        package_root = f"{ctx.agent_dir}/py"
        files = _package_files(f"{package_root}/{_PACKAGE}")
    loop_config = {**asdict(config), "base_url": ctx.base_url, "model": ctx.model,
                   "state_dir": f"{ctx.agent_dir}/terminus"}
    config_path = f"{ctx.agent_dir}/terminus.json"
    files.append(AgentFile(config_path, json.dumps(loop_config)))
    argv = ("python3", "-I", "-S", "-B", "-c", _BOOT, package_root, config_path)
    return Launch(argv=argv, env={"TERMINUS_API_KEY": ctx.token}, files=tuple(files))


def parse_terminus_events(text: str) -> AgentReport:
    """Total: any text gives a report (see `events.json_lines` for the bounds)."""
    report = AgentReport()
    for event in json_lines(text, report):
        kind = event.get("type")
        if kind == "turn":
            report.steps += 1
        elif kind == "command":
            report.add_tool("terminal", event.get("command"))
        elif kind in ("text", "final"):
            report.add_text(event.get("text"))
        elif kind in ("error", "parse_failure"):
            report.add_error(event.get("error") or event.get("reason"))
    return report


TERMINUS = CliAgentSpec(
    name="terminus",
    version=VERSION,
    installs=(),
    version_package=None,
    render=render,
    parse_events=parse_terminus_events,
)


class TerminusAgent(CliAgent):
    name = "terminus"
    spec = TERMINUS
