"""What a Harbor task's Dockerfile asks for, as far as a sandbox without Docker can honour it.

Only `FROM`, `WORKDIR`, `COPY` and `ENV` (and the inert `ARG`, `LABEL`, comments) can be honoured outside Docker:
the files a `COPY` names are laid into the workdir, `ENV` becomes the request's `env` (`dockerfile_env`), `WORKDIR`
is reported. Anything else (`RUN` installing packages, say) needs the Docker backend.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import dataclass, field

__all__ = ["Copy", "DockerfilePlan", "dockerfile_env", "parse_dockerfile"]

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


_REFERENCE = re.compile(r"\$(?:\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)\}|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))")


def dockerfile_env(plan: DockerfilePlan, base: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """The variables the Dockerfile's `ENV`s set, in order, each value's `$NAME` / `${NAME}` expanded against
    `base` and the ENVs before it (as Docker expands them at build time; an unknown name is empty), with the
    problems: an ENV that cannot be parsed. Both forms: `ENV A=1 B="two words"` and `ENV A one value`."""
    seen = dict(base)
    out: dict[str, str] = {}
    problems: list[str] = []
    for raw in plan.env:
        try:
            pairs = _env_pairs(raw)
        except ValueError:
            problems.append(f"ENV {raw[:80]} (cannot parse)")
            continue
        for name, value in pairs:
            value = _REFERENCE.sub(lambda m: seen.get(m["braced"] or m["bare"], ""), value)
            seen[name] = out[name] = value
    return out, problems


def _env_pairs(raw: str) -> list[tuple[str, str]]:
    words = shlex.split(raw, posix=True)
    if not words:
        raise ValueError("empty")
    if "=" not in words[0]:  # the legacy form: one name, the rest of the line its value
        name, _, value = raw.strip().partition(" ")
        return [(_name(name), value.strip())]
    pairs = []
    for word in words:
        name, sep, value = word.partition("=")
        if not sep:
            raise ValueError(word)
        pairs.append((_name(name), value))
    return pairs


def _name(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ValueError(name)
    return name
