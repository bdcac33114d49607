"""Which environment variables decide what code a command loads, and verify's hardened environment.

A verify command runs tools (bash, python3, pytest) whose search paths and start-up hooks come from the
environment. Anything those variables point at that the agent could write hands verify to the agent: a
`PATH` entry in the workspace runs a planted `python3`, an `LD_PRELOAD` entry there injects a library into
every process, a `PYTHONPATH` entry shadows `unittest` or `pytest`, and Python's own default (the current
directory first on `sys.path` for `-m` and `-c`, the script's directory for a script) lets a planted
`pytest.py` run instead of pytest.

Contracts (pure functions, no I/O):
- `workspace_entry(name, value, roots)`: the first entry of a search-path variable that the agent could
  control (relative, empty, or under one of `roots`), else None. Used to refuse a task's `env` at validation.
- `hardened_overlay(base, roots, fallback_path=..., guard=...)`: what verify adds over a command's base
  environment so that none of that applies: Python's safe path and no user site, the code-injecting variables
  emptied, and the entries under `roots` dropped from the other search paths. With `guard` (the sandbox's
  read-only directory holding the path guard, `Sandbox.path_guard`), PYTHONPATH names it alone: Python then puts
  the directory it would have put first at the END of `sys.path` (after the standard library and installed
  packages) instead of leaving it off, so the agent's own modules import and shadow nothing. An empty value is
  how a variable is "unset" here (the overlay is added over the base, it cannot remove): Python, the dynamic
  loader and bash all treat an empty value of these variables as unset.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping

__all__ = [
    "AGENT_WRITABLE_ROOTS",
    "CLEARED_FOR_VERIFY",
    "SEARCH_PATH_VARS",
    "VERIFY_SET",
    "hardened_overlay",
    "under_root",
    "workspace_entry",
]

AGENT_WRITABLE_ROOTS: tuple[str, ...] = ("/workspace", "/home", "/tmp", "/var/tmp", "/dev/shm", "/logs")
"""Directories an agent can write on every backend that shows the standard layout (`SandboxPaths`: workdir,
home, tmp, logs; plus the other world-writable places). A sandbox with other paths (unisolated, remote) adds its
own at verify time."""

SEARCH_PATH_VARS: frozenset[str] = frozenset({
    "PATH", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "PYTHONPYCACHEPREFIX",
    "LD_LIBRARY_PATH", "LD_PRELOAD", "LD_AUDIT", "BASH_ENV", "ENV",
    "NODE_PATH", "PERL5LIB", "PERLLIB", "RUBYLIB", "GEM_PATH", "GEM_HOME", "CLASSPATH",
})
"""Variables whose entries are places code is loaded from (a search path, a preload list, a start-up file)."""

CLEARED_FOR_VERIFY: tuple[str, ...] = (
    "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "PYTHONPYCACHEPREFIX", "PYTHONINSPECT",
    "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "BASH_ENV", "ENV",
)
"""Emptied for verify whatever the task sets: each injects code before the verifier's own runs (a module
ahead of the standard library, a preloaded library, a shell start-up file, cached bytecode) and a verifier
never needs it. The rest of `SEARCH_PATH_VARS` keeps its entries outside the agent's roots."""

VERIFY_SET: Mapping[str, str] = {"PYTHONSAFEPATH": "1", "PYTHONNOUSERSITE": "1"}
"""Python never puts the current or the script's directory first on `sys.path` (3.11+), nor the user site (the
path guard, where the sandbox has one, puts that directory last instead)."""

_PRELOAD_SEPARATORS = re.compile(r"[:\s]")


def _entries(name: str, value: str) -> list[str]:
    """A variable's entries: `:`-separated (the loader's preload lists also split on white space). An empty
    value has none (unset); an empty entry inside a list stays (it means the current directory)."""
    if value == "":
        return []
    if name in ("LD_PRELOAD", "LD_AUDIT"):
        return [entry for entry in _PRELOAD_SEPARATORS.split(value) if entry]
    return value.split(":")


def under_root(path: str, roots: Iterable[str]) -> str | None:
    """The root of `roots` that absolute `path` lies in (after normalising `..`), else None."""
    normal = posixpath.normpath(path)
    for root in roots:
        root = posixpath.normpath(root)
        if normal == root or normal.startswith(root.rstrip("/") + "/"):
            return root
    return None


def _agent_controlled(entry: str, roots: Iterable[str]) -> str | None:
    """Why `entry` is a place the agent controls, else None."""
    if entry == "":
        return "is empty (the current directory: the workdir)"
    if not entry.startswith("/"):
        # Relative (also "", "." and "~/..."): resolved against the command's directory, the workdir.
        return "is relative (resolved against the workdir)"
    root = under_root(entry, roots)
    return None if root is None else f"is inside {root}, which the agent can write"


def workspace_entry(name: str, value: str, roots: Iterable[str] = AGENT_WRITABLE_ROOTS) -> str | None:
    """For a `SEARCH_PATH_VARS` variable: a sentence naming its first entry the agent controls, else None."""
    if name not in SEARCH_PATH_VARS:
        return None
    for entry in _entries(name, value):
        reason = _agent_controlled(entry, roots)
        if reason is not None:
            return f"{name} entry {entry!r} {reason}"
    return None


def hardened_overlay(
    base: Mapping[str, str], roots: Iterable[str], *, fallback_path: str, guard: str | None = None
) -> dict[str, str]:
    """What verify sets over `base` (a command's environment before verify adds its own): see the module
    docstring. A PATH left with no entry becomes `fallback_path`; `guard` (an absolute directory no process of
    the sandbox can write: the backend's promise, `Sandbox.path_guard`) is PYTHONPATH's one entry."""
    roots = tuple(roots)
    overlay: dict[str, str] = dict(VERIFY_SET)
    for name in CLEARED_FOR_VERIFY:
        if base.get(name):
            overlay[name] = ""
    if guard is not None:
        if not guard.startswith("/") or ":" in guard:
            raise ValueError(f"path guard {guard!r} is not one absolute directory")
        overlay["PYTHONPATH"] = guard
    for name in sorted(SEARCH_PATH_VARS - set(CLEARED_FOR_VERIFY)):
        value = base.get(name)
        if not value:
            continue
        kept = [entry for entry in _entries(name, value) if _agent_controlled(entry, roots) is None]
        if len(kept) != len(_entries(name, value)):
            overlay[name] = ":".join(kept) or (fallback_path if name == "PATH" else "")
    return overlay
