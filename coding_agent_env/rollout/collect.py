"""Read the workdir's files back out of the sandbox, within the budget.

Only regular UTF-8 files are returned. Symlinks (wherever they point), other special files, binary files and
files beyond the count or byte caps are listed in `omitted` instead; the omitted list is itself capped.
The workdir is the agent's output: a file that cannot be read (or is no longer a regular file) is omitted, and a
workdir that cannot be listed gives no files and a note in `omitted`; neither raises.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from coding_agent_env.errors import SandboxFileError
from coding_agent_env.sandbox.base import Sandbox
from coding_agent_env.settings import Settings

__all__ = ["Collected", "collect_files"]


@dataclass
class Collected:
    files: dict[str, str] = field(default_factory=dict)
    omitted: list[str] = field(default_factory=list)


async def collect_files(sandbox: Sandbox, settings: Settings) -> Collected:
    out = Collected()
    listing_cap = settings.collect_max_files + settings.collect_max_omitted
    try:
        entries, cut = await sandbox.list_files(sandbox.paths.workdir, max_entries=listing_cap)
    except SandboxFileError as exc:
        out.omitted.append(f"... (the workdir could not be listed: {exc})")
        return out
    total = 0

    def omit(path: str) -> None:
        if len(out.omitted) < settings.collect_max_omitted:
            out.omitted.append(path)

    for entry in entries:
        if entry.kind == "dir":
            continue
        if entry.kind != "file" or entry.size > settings.collect_max_file_bytes:
            omit(entry.path)
            continue
        if len(out.files) >= settings.collect_max_files or total + entry.size > settings.collect_max_total_bytes:
            omit(entry.path)
            continue
        try:
            data = await sandbox.read_bytes(entry.path, max_bytes=settings.collect_max_file_bytes)
            text = data.decode("utf-8")
        except (SandboxFileError, UnicodeDecodeError):
            omit(entry.path)
            continue
        out.files[entry.path] = text
        total += len(data)
    if cut:
        omit("...")
    return out
