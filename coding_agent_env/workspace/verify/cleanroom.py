"""Verification the agent cannot touch: hidden verify files and the clean room.

Both run only after the agent's whole process tree is dead, so nothing can change the workspace while it is
read.

- Hidden verify files (`place_verify_files`) are written just before verify, replacing whatever the agent left
  at their paths (a file, a symlink or a directory): the agent never saw them and cannot have edited them.
- The clean room (`open_clean_room`, then `furnish`) is a fresh sandbox of the same backend and image holding
  the task's original files as its setup left them, the declared artifacts copied out of the agent's workspace,
  and the verify files; nothing else the agent wrote reaches it, so planted modules (`unittest/`, `conftest.py`,
  `sitecustomize.py`, `.pth` files), edited tests and planted reward files have no effect on verify. Artifacts
  are copied as bytes, regular files only: a symlink, a directory, a FIFO, a socket or a device named like an
  artifact is refused, as is a file over the size cap, and the report says why.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from coding_agent_env.aio import shielded
from coding_agent_env.errors import SandboxFileError
from coding_agent_env.models import ArtifactReport
from coding_agent_env.sandbox.base import FileEntry, Sandbox, SandboxBackend, SandboxSpec
from coding_agent_env.settings import SettingsSection

__all__ = ["ArtifactCaps", "Artifacts", "collect_artifacts", "furnish", "open_clean_room", "place_verify_files"]

_GLOB_CHARS = frozenset("*?[")
_KIND_REASONS = {
    "symlink": "a symlink (only regular files are copied)",
    "dir": "a directory (name the files inside it)",
    "other": "not a regular file (a FIFO, socket or device)",
}


@dataclass(frozen=True)
class ArtifactCaps(SettingsSection):
    """Bounds on what a clean room takes from the agent's workspace."""

    PREFIX = "artifact_"

    max_files: int
    max_file_bytes: int
    max_total_bytes: int
    max_listing: int
    """Entries of the workspace listed to match patterns against; beyond it, unmatched patterns say so."""


@dataclass
class Artifacts:
    """The artifacts read out of the agent's workspace, and the report of what was taken."""

    data: dict[str, bytes] = dataclasses.field(default_factory=dict)
    report: ArtifactReport = dataclasses.field(default_factory=ArtifactReport)


def _is_glob(pattern: str) -> bool:
    return not _GLOB_CHARS.isdisjoint(pattern)


def _matches(entries: Sequence[FileEntry], pattern: str) -> list[FileEntry]:
    """Entries a pattern names: an exact path names one entry of any kind (so a directory or symlink named like
    an artifact is reported); a glob names the entries that match it, directories excepted."""
    if not _is_glob(pattern):
        return [entry for entry in entries if entry.path == pattern]
    return [entry for entry in entries if entry.kind != "dir" and fnmatch.fnmatchcase(entry.path, pattern)]


async def collect_artifacts(sandbox: Sandbox, patterns: Sequence[str], caps: ArtifactCaps) -> Artifacts:
    """Read the regular files `patterns` name in the workspace of `sandbox`, within `caps`. Call only once no
    process of the agent is alive."""
    out = Artifacts()
    try:
        entries, cut = await sandbox.list_files(sandbox.paths.workdir, max_entries=caps.max_listing)
    except SandboxFileError as exc:
        # The workspace is the agent's output: one that cannot be listed yields no artifacts (verify then scores
        # what the clean room holds without them), never a failure of verify.
        out.report.missing.extend(f"{pattern} (the workspace could not be listed: {exc})" for pattern in patterns)
        return out
    chosen: dict[str, FileEntry] = {}
    for pattern in patterns:
        found = _matches(entries, pattern)
        if not found:
            out.report.missing.append(f"{pattern} (workspace listing cut short)" if cut else pattern)
        for entry in found:
            chosen.setdefault(entry.path, entry)
    total = 0
    for path, entry in sorted(chosen.items()):
        reason = _KIND_REASONS.get(entry.kind)
        if reason is None and len(out.data) >= caps.max_files:
            reason = f"over the artifacts' cap of {caps.max_files} files"
        if reason is None:
            reason, data = await _read_capped(sandbox, path, caps, total)
            if data is not None:
                out.data[path] = data
                out.report.copied.append(path)
                total += len(data)
        if reason is not None:
            out.report.refused[path] = reason
    return out


async def _read_capped(sandbox: Sandbox, path: str, caps: ArtifactCaps, total: int) -> tuple[str | None, bytes | None]:
    """(why it is refused, None) or (None, its bytes)."""
    if total >= caps.max_total_bytes:
        return f"over the artifacts' total cap of {caps.max_total_bytes} bytes", None
    try:
        data = await sandbox.read_bytes(path, max_bytes=caps.max_file_bytes + 1)
    except SandboxFileError as exc:
        return f"unreadable: {exc}", None
    if len(data) > caps.max_file_bytes:
        return f"larger than the cap of {caps.max_file_bytes} bytes", None
    if total + len(data) > caps.max_total_bytes:
        return f"over the artifacts' total cap of {caps.max_total_bytes} bytes", None
    return None, data


async def place_verify_files(sandbox: Sandbox, files: Mapping[str, str], *, clear: bool = True) -> None:
    """Write the hidden verify files, replacing whatever is at their paths. With `clear` (a workspace the agent
    used), each path is removed first, so a directory there is gone and a symlink is never followed."""
    for path, text in files.items():
        if clear:
            await sandbox.remove(path)
        await sandbox.write_text(path, text)


async def open_clean_room(backend: SandboxBackend, spec: SandboxSpec, *, files: Mapping[str, str]) -> Sandbox:
    """A fresh sandbox like the agent's (same backend and image; no network, no relay, no agents) holding the
    task's files. The caller runs the task's setup in it, then `furnish`es it, and closes it."""
    room_spec = dataclasses.replace(
        spec, rollout_id=f"{spec.rollout_id}-verify", network="none", relay=None, agents_dir=None
    )
    room = await backend.create(room_spec)
    try:
        for path, text in files.items():
            await room.write_text(path, text)
    except BaseException:
        await shielded(room.close())
        raise
    return room


async def furnish(room: Sandbox, artifacts: Mapping[str, bytes], verify_files: Mapping[str, str]) -> None:
    """The artifacts over what setup left, then the verify files over both."""
    for path, data in artifacts.items():
        await room.remove(path)
        await room.write_bytes(path, data)
    await place_verify_files(room, verify_files)
