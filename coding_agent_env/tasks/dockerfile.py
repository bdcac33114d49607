"""What a Harbor task's Dockerfile asks for, as far as a sandbox without Docker can honour it.

Only `FROM`, `WORKDIR`, `COPY` and `ENV` (and the inert `ARG`, `LABEL`, comments) can be honoured outside Docker:
the files a `COPY` names are laid into the workdir, `WORKDIR` and `ENV` are reported. Anything else (`RUN`
installing packages, say) needs the Docker backend.
"""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass, field

__all__ = ["Copy", "DockerfilePlan", "parse_dockerfile"]

_HONOURED = frozenset({"FROM", "WORKDIR", "COPY", "ENV"})
_INERT = frozenset({"ARG", "LABEL", "MAINTAINER"})


@dataclass(frozen=True)
class Copy:
    sources: tuple[str, ...]
    dest: str
    """Absolute, resolved against the WORKDIR in effect."""


@dataclass
class DockerfilePlan:
    workdir: str = "/"
    copies: list[Copy] = field(default_factory=list)
    env: list[str] = field(default_factory=list)
    unsupported: list[str] = field(default_factory=list)
    """Instructions only Docker can run, each as `KEYWORD (line N)`."""


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Lines with backslash continuations joined, comments and blanks dropped, with their first line number."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append((start, pending + line))
        pending = ""
    if pending:
        out.append((start, pending))
    return out


def parse_dockerfile(text: str) -> DockerfilePlan:
    plan = DockerfilePlan()
    for number, line in _logical_lines(text):
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword in _INERT:
            continue
        if keyword not in _HONOURED:
            plan.unsupported.append(f"{keyword} (line {number})")
        elif keyword == "WORKDIR":
            plan.workdir = posixpath.normpath(posixpath.join(plan.workdir, rest.strip()))
        elif keyword == "ENV":
            plan.env.append(rest.strip())
        elif keyword == "COPY":
            _copy(plan, rest, number)
    return plan


def _copy(plan: DockerfilePlan, rest: str, number: int) -> None:
    try:
        words = shlex.split(rest)
    except ValueError:
        plan.unsupported.append(f"COPY (line {number}: cannot parse)")
        return
    words = [word for word in words if not word.startswith("--")]
    if words and words[0].startswith("["):
        plan.unsupported.append(f"COPY (line {number}: JSON form)")
        return
    if len(words) < 2:
        plan.unsupported.append(f"COPY (line {number}: no destination)")
        return
    last = words[-1]
    dest = posixpath.normpath(posixpath.join(plan.workdir, last))
    if last.endswith("/") or posixpath.basename(last) in (".", ".."):
        dest = dest.rstrip("/") + "/"  # a directory: sources go inside it
    plan.copies.append(Copy(tuple(words[:-1]), dest))
