"""The image map: base images rewritten before a build, for private registries, mirrors and offline hosts.

An image map is a set of rules `FROM=TO` (the `IMAGE_MAP` setting, comma-separated, and `run --image-map FROM=TO`,
repeatable; the flag's rules win over the setting's for the same FROM). A reference is mapped by the first rule
that fits, in this order:

1. **Exact**: FROM is the whole reference (`python:3.11-slim=registry.local/python:3.11-slim`). A reference
   without a tag also matches FROM written with `:latest`, and the reverse.
2. **Prefix**: FROM is a registry, a registry path or a repository, without tag or digest, and the reference's
   repository is FROM or starts with FROM followed by `/`: that part is replaced by TO, the rest (further path,
   tag, digest) kept. `python=mirror.local/python` maps `python:3.11` to `mirror.local/python:3.11`;
   `ghcr.io/org=registry.local/org` maps `ghcr.io/org/tool@sha256:...` to `registry.local/org/tool@sha256:...`.
   The longest fitting FROM wins. A rule whose FROM or TO has a tag or digest is exact only; a FROM ending in
   `/` is a prefix whatever it looks like (a registry with a port: `localhost:5000/=mirror.local/`).

Rules and references are compared as written and as Docker reads them in full (`python:3.11` is
`docker.io/library/python:3.11`), so `python:3.11=...` also maps `docker.io/library/python:3.11`, and
`docker.io=mirror.local/hub` maps `python:3.11` to `mirror.local/hub/library/python:3.11`. `scratch`, a
previous build stage's name and a reference holding a build argument (`$BASE`) are never mapped.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping

__all__ = ["ImageMapError", "map_image", "mapped_hash", "parse_image_map", "rewrite_from"]

_DEFAULT_REGISTRY = "docker.io"
_FROM_LINE = re.compile(r"^(?P<lead>\s*FROM\s+)(?P<args>.*?)\s*$", re.IGNORECASE)
_WORD = re.compile(r"\S+")
_REFERENCE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]*")


class ImageMapError(ValueError):
    """An image map entry that is not `FROM=TO` with two image references."""


def parse_image_map(entries: str | Iterable[str] | Mapping[str, str] | None) -> dict[str, str]:
    """The rules of `entries`: a comma-separated string (`IMAGE_MAP`), strings `FROM=TO` (each may itself hold
    several, comma-separated), or a mapping; later entries win. `ImageMapError` names a malformed one."""
    if entries is None:
        return {}
    if isinstance(entries, Mapping):
        pairs = list(entries.items())
    else:
        items = [entries] if isinstance(entries, str) else list(entries)
        pairs = []
        for item in items:
            for entry in str(item).split(","):
                entry = entry.strip()
                if not entry:
                    continue
                source, sep, target = entry.partition("=")
                if not sep:
                    raise ImageMapError(f"image map entry {entry!r} is not FROM=TO")
                pairs.append((source, target))
    rules: dict[str, str] = {}
    for source, target in pairs:
        source, target = str(source).strip(), str(target).strip()
        for side in (source, target):
            if not _REFERENCE.fullmatch(side):
                raise ImageMapError(f"image map entry {source}={target}: {side!r} is not an image reference")
        rules[source] = target
    return rules


def _split(reference: str) -> tuple[str, str]:
    """(repository, suffix): the suffix is `:tag`, `@digest` or both, as written (`''` for none)."""
    at = reference.find("@")
    name, digest = (reference[:at], reference[at:]) if at >= 0 else (reference, "")
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        return name[:colon], name[colon:] + digest
    return name, digest


def _is_host(part: str) -> bool:
    return "." in part or ":" in part or part == "localhost"


def _full(reference: str) -> str:
    """`reference` as Docker reads it: with its registry (`docker.io` when the first part is not a host) and,
    on Docker Hub, `library/` for an official image."""
    first, _, rest = reference.partition("/")
    if rest and _is_host(first):
        return reference
    if not rest:
        return f"{_DEFAULT_REGISTRY}/library/{reference}"
    return f"{_DEFAULT_REGISTRY}/{reference}"


def _same_exact(reference: str, source: str) -> bool:
    if reference == source:
        return True
    ref_repo, ref_suffix = _split(reference)
    src_repo, src_suffix = _split(source)
    return ref_repo == src_repo and {ref_suffix, src_suffix} == {"", ":latest"}


def _prefix_rule(source: str, target: str) -> tuple[list[str], str] | None:
    """The repository prefixes a prefix rule matches (as written, and in full unless it is a registry alone),
    and its target; None for a rule that is exact only."""
    if source.endswith("/"):  # a registry with a port, or any prefix said to be one
        return [source.rstrip("/")], target.rstrip("/")
    if _split(source)[1] or _split(target)[1]:
        return None
    if "/" not in source and _is_host(source):
        return [source], target
    if "/" not in source:  # an official image, or a Docker Hub namespace
        return [source, _full(source), f"{_DEFAULT_REGISTRY}/{source}"], target
    return list(dict.fromkeys([source, _full(source)])), target


def map_image(reference: str, image_map: Mapping[str, str]) -> str:
    """`reference` rewritten by the first rule of `image_map` that fits (see the module), else unchanged."""
    if not image_map or not reference or reference == "scratch" or "$" in reference:
        return reference
    forms = list(dict.fromkeys([reference, _full(reference)]))
    for source, target in image_map.items():
        if not source.endswith("/") and any(_same_exact(form, _full(source)) or _same_exact(form, source)
                                            for form in forms):
            return target
    best: tuple[int, str] | None = None
    for source, target in image_map.items():
        rule = _prefix_rule(source, target)
        if rule is None:
            continue
        prefixes, replacement = rule
        for form in forms:
            repository, suffix = _split(form)
            added = len(forms[-1]) - len(form)  # a match on the form as written, measured on the full form
            for prefix in prefixes:
                if (repository == prefix or repository.startswith(prefix + "/")) and (
                        best is None or len(prefix) + added > best[0]):
                    best = (len(prefix) + added, replacement + repository[len(prefix):] + suffix)
    return best[1] if best is not None else reference


def rewrite_from(dockerfile_text: str, image_map: Mapping[str, str]) -> tuple[str, list[str]]:
    """`dockerfile_text` with the base image of every `FROM` mapped (`--platform=...` and `AS name` kept, the
    rest of the text byte for byte), and a note per rewritten line: `FROM python:3.11 (line 1) -> mirror/...`.
    A `FROM` naming an earlier stage is left alone."""
    if not image_map:
        return dockerfile_text, []
    stages: set[str] = set()
    notes: list[str] = []
    lines = dockerfile_text.splitlines(keepends=True)
    for index, line in enumerate(lines):
        match = _FROM_LINE.match(line.rstrip("\r\n"))
        if match is None:
            continue
        words = list(_WORD.finditer(match["args"]))
        image = next((word for word in words if not word.group().startswith("--")), None)
        if image is None:
            continue
        reference = image.group()
        earlier_stage = reference.lower() in stages
        rest = [word.group() for word in words[words.index(image) + 1:]]
        if len(rest) >= 2 and rest[0].lower() == "as":
            stages.add(rest[1].lower())
        if earlier_stage:
            continue
        mapped = map_image(reference, image_map)
        if mapped == reference:
            continue
        start = match.start("args") + image.start()
        lines[index] = line[:start] + mapped + line[start + len(reference):]
        notes.append(f"FROM {reference} (line {index + 1}) -> {mapped}")
    return "".join(lines), notes


def mapped_hash(content_hash: str, dockerfile_text: str, image_map: Mapping[str, str]) -> str:
    """The cache key of a build context whose Dockerfile is rewritten by `image_map`: `content_hash` itself when
    nothing is rewritten, else a hash of it and the rewritten Dockerfile (a mapped build never shares a tag with
    the unmapped one)."""
    text, notes = rewrite_from(dockerfile_text, image_map)
    if not notes:
        return content_hash
    return hashlib.sha256(f"{content_hash}\0{text}".encode()).hexdigest()
