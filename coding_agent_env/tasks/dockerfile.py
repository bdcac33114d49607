"""What a Harbor task's Dockerfile asks for, as far as a sandbox without Docker can honour it.

- Honoured outside Docker: `FROM` (the base is the sandbox's own system), `WORKDIR` (`plan.workdir`), `COPY` from
  the build context (`plan.copies`, each destination absolute), `ENV` (`plan.env`, made the request's `env` by
  `dockerfile_env`) and `USER` (`plan.user`: the final stage's last one, the image's user).
- Ignored, each recorded in `plan.ignored` as `KEYWORD (line N)`: the instructions that change no file of the
  image (`CMD`, `ENTRYPOINT`, `LABEL`, `EXPOSE`, `ARG`, `SHELL`, `HEALTHCHECK`, `VOLUME`, `STOPSIGNAL`,
  `MAINTAINER`, and `ONBUILD`, which only acts in images built *from* this one).
- Anything else (`RUN` installing packages, `ADD`, a `COPY --from` another stage or image, a heredoc) is in
  `plan.unsupported`: it needs the Docker backend.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import dataclass, field

__all__ = ["IGNORED", "Copy", "DockerfilePlan", "dockerfile_env", "parse_dockerfile"]

_HONOURED = frozenset({"FROM", "WORKDIR", "COPY", "ENV", "USER"})
IGNORED = frozenset({"CMD", "ENTRYPOINT", "LABEL", "EXPOSE", "ARG", "SHELL", "HEALTHCHECK", "VOLUME", "STOPSIGNAL",
                     "MAINTAINER", "ONBUILD"})
"""Instructions that change no file of the image being built: skipped outside Docker, each noted."""
_HEREDOC = re.compile(r"(?:^|\s)<<-?([\"']?)([A-Za-z_][A-Za-z0-9_]*)\1")
_HEREDOC_KEYWORDS = ("RUN", "COPY", "ADD")


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
    """Instructions only Docker can run, each as `KEYWORD (line N)` (with what is wrong, for a COPY)."""
    ignored: list[str] = field(default_factory=list)
    """Instructions that change no file (`IGNORED`), skipped, each as `KEYWORD (line N)`."""
    user: str | None = None
    """The image's user: the last `USER` of the final stage (its user part: `USER app:staff` gives `app`);
    None without one (the image runs as root)."""


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Lines with backslash continuations joined, comments and blanks dropped, with their first line number. A
    heredoc's body (`RUN <<EOF` ... `EOF`) is left out: its instruction keeps the `<<` that marks it."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    terminators: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if terminators:
            if raw.strip() == terminators[0]:
                terminators.pop(0)
            continue
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical = pending + line
        out.append((start, logical))
        if logical.split(None, 1)[0].upper() in _HEREDOC_KEYWORDS:
            terminators = [match[2] for match in _HEREDOC.finditer(logical)]
        pending = ""
    if pending:
        out.append((start, pending))
    return out


def parse_dockerfile(text: str) -> DockerfilePlan:
    plan = DockerfilePlan()
    for number, line in _logical_lines(text):
        keyword, rest = (line.split(None, 1) + [""])[:2]
        keyword = keyword.upper()
        if keyword in IGNORED:
            plan.ignored.append(f"{keyword} (line {number})")
        elif keyword not in _HONOURED:
            plan.unsupported.append(f"{keyword} (line {number})")
        elif keyword == "FROM":
            plan.user = None  # a new stage: the image's user is the final stage's
        elif keyword == "USER":
            plan.user = rest.strip().partition(":")[0] or None
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
    if any(word.startswith("--from") for word in words):
        plan.unsupported.append(f"COPY (line {number}: --from another stage or image)")
        return
    if "<<" in rest:
        plan.unsupported.append(f"COPY (line {number}: heredoc)")
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
