"""Declarative CLI agents: everything the driver needs to run one, and nothing it has to special-case.

A `CliAgentSpec` says which pinned npm packages make up the agent (installed once into its own prefix under
`Settings.agents_dir`, see `agents.install`), how to render one rollout's launch from the relay endpoint,
token and model (`render` -> `Launch`: config files, environment, argv, links into HOME), where its JSON
events go and how to read them (`parse_events` -> `AgentReport`).

Contract for `render`: the token may appear only in `Launch.env` or in a `Launch.files` entry written 0600;
never in `argv`, link paths or any file readable by others. The instruction never appears in a `Launch` at
all: the driver feeds it to the CLI on stdin from the instruction file.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from coding_agent_env.agents.event_stream import AgentReport

__all__ = [
    "AgentFile",
    "CliAgentSpec",
    "HomeLink",
    "Launch",
    "LaunchContext",
    "NpmInstall",
    "NpmPackage",
    "PipInstall",
    "PipPackage",
    "SpecError",
]

_VERSION = re.compile(r"^\d+\.\d+\.\d+$")
_NPM_NAME = re.compile(r"^(@[a-z0-9][a-z0-9._-]*/)?[a-z0-9][a-z0-9._-]*$")
_REL_PATH = re.compile(r"^(?!/)(?!.*(^|/)\.\.?(/|$))[A-Za-z0-9._@/+-]+$")
_SECRET_MODE = 0o600


class SpecError(ValueError):
    """A spec (or what it rendered) breaks the contract; a programming error, caught by the tests."""


@dataclass(frozen=True)
class _Pinned:
    """One package at one exact version (no ranges: what is installed is what was validated)."""

    name: str
    version: str
    KIND: ClassVar[str]
    NAME: ClassVar[re.Pattern[str]]
    PIN: ClassVar[str]
    """What joins name and version in the installer's argument."""

    def __post_init__(self) -> None:
        if not self.NAME.match(self.name):
            raise SpecError(f"invalid {self.KIND} package name {self.name!r}")
        if not _VERSION.match(self.version):
            raise SpecError(f"{self.name}: version {self.version!r} is not an exact x.y.z version")

    @property
    def pinned(self) -> str:
        return f"{self.name}{self.PIN}{self.version}"


@dataclass(frozen=True)
class NpmPackage(_Pinned):
    """One npm package at one exact version."""

    KIND = "npm"
    NAME = _NPM_NAME
    PIN = "@"


@dataclass(frozen=True)
class PipPackage(_Pinned):
    """One PyPI package at one exact version."""

    KIND = "PyPI"
    NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    PIN = "=="


@dataclass(frozen=True)
class NpmInstall:
    """Packages installed together with `npm install --prefix <agent prefix>/<subdir>`."""

    packages: tuple[NpmPackage, ...]
    subdir: str = "."

    def __post_init__(self) -> None:
        if self.subdir != "." and not _REL_PATH.match(self.subdir):
            raise SpecError(f"install subdir {self.subdir!r} must be a plain relative path")


@dataclass(frozen=True)
class PipInstall:
    """Packages installed together into a virtualenv at `<agent prefix>/<subdir>`, made by `python` (a system
    interpreter sandboxes can see: the venv's interpreter is a link to it)."""

    packages: tuple[PipPackage, ...]
    subdir: str = "venv"
    python: str = "/usr/bin/python3"

    def __post_init__(self) -> None:
        if not _REL_PATH.match(self.subdir):
            raise SpecError(f"install subdir {self.subdir!r} must be a plain relative path")


@dataclass(frozen=True)
class LaunchContext:
    """What a spec renders one rollout's launch from. All paths are sandbox paths."""

    base_url: str
    """The relay as the agent sees it (OpenAI-compatible, ends in /v1)."""
    token: str
    """The per-rollout relay token: the agent's api key. Secret."""
    model: str
    home: str
    workdir: str
    agent_dir: str
    """Private scratch directory of the agent (configs, events, scripts)."""
    prefix: str
    """Where this agent's install prefix is visible inside the sandbox (read-only)."""
    title: str
    """A short, fixed, non-secret session title."""


@dataclass(frozen=True)
class AgentFile:
    """A file the driver writes before the launch, as UTF-8. Files holding the token must be mode 0600. The
    content is a `str`, so every file can be searched for the token."""

    path: str
    content: str
    mode: int = _SECRET_MODE

    def data(self) -> bytes:
        """The bytes written (as `Sandbox.write_text` does: surrogate escapes become raw bytes)."""
        return self.content.encode("utf-8", "surrogateescape")


@dataclass(frozen=True)
class HomeLink:
    """Prepared inside the sandbox before the CLI starts: `dest` (relative to HOME) becomes a symlink to
    `source` (relative to the install prefix), or a copy of it with `copy`."""

    source: str
    dest: str
    copy: bool = False

    def __post_init__(self) -> None:
        for path in (self.source, self.dest):
            if not _REL_PATH.match(path):
                raise SpecError(f"link path {path!r} must be a plain relative path")


@dataclass(frozen=True)
class Launch:
    """One rollout's launch, rendered by a spec."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    files: tuple[AgentFile, ...] = ()
    links: tuple[HomeLink, ...] = ()


@dataclass(frozen=True)
class CliAgentSpec:
    """A CLI coding agent, declared. See the module docstring for the contracts of `render`."""

    name: str
    installs: tuple[NpmInstall | PipInstall, ...]
    """npm installs and virtualenvs making up the agent (empty for agents shipped with this package)."""
    render: Callable[[LaunchContext], Launch]
    parse_events: Callable[[str], AgentReport]
    """Total: never raises, bounded work on any text."""
    version_package: str | None = ""
    """The package whose installed `package.json` version must equal `version` (None: nothing to check).
    Unsaid (""): the agent's own package, the first of its first install."""
    version: str = ""
    """The agent's own version: pinned, validated at definition and against what is installed. Unsaid (""):
    the version `version_package` is pinned at."""
    events_file: str = "events.jsonl"
    """Name (in the agent dir) of the file the CLI's stdout (its JSON events) is redirected to."""
    artifacts: tuple[str, ...] = ()
    """HOME-relative paths of the agent's own logs, for operators; not copied into the result."""
    extra_env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not re.match(r"^[a-z][a-z0-9_-]*$", self.name):
            raise SpecError(f"invalid agent name {self.name!r}")
        pinned = {p.name: p.version for i in self.installs for p in i.packages}
        if self.version_package == "":  # frozen: the defaults are filled in once, here
            object.__setattr__(self, "version_package", next(iter(pinned), None))
        if self.version == "" and self.version_package is not None:
            object.__setattr__(self, "version", pinned.get(self.version_package, ""))
        if not _VERSION.match(self.version):
            raise SpecError(f"{self.name}: version {self.version!r} is not an exact x.y.z version")
        if self.version_package is not None and pinned.get(self.version_package) != self.version:
            raise SpecError(f"{self.name}: {self.version_package} must be pinned at {self.version}")

    @property
    def prefix_name(self) -> str:
        """Directory (under the agents dir) of this agent's install: versioned, so versions coexist."""
        return f"{self.name}-{self.version}"

    @property
    def needs_install(self) -> bool:
        return bool(self.installs)

    def launch(self, ctx: LaunchContext) -> Launch:
        """Render and check the launch: the token must not leak into argv, links or world-readable files."""
        launch = self.render(ctx)
        if any(ctx.token in arg for arg in launch.argv):
            raise SpecError(f"{self.name}: the token must not appear in argv")
        for item in launch.files:
            if ctx.token in item.content and item.mode & 0o077:
                raise SpecError(f"{self.name}: {item.path} holds the token but is not 0600")
        return launch
