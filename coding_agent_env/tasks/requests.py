"""Our own request files: one JSON or YAML mapping per file, or JSONL (one request per line)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from coding_agent_env.models import RolloutRequest, validation_summary
from coding_agent_env.tasks.base import LoadedTask, TaskError

__all__ = ["load_request_file", "parse_request", "read_jsonl"]


def parse_request(data: Any, source: str) -> LoadedTask | TaskError:
    """A request from decoded data (its optional `split` kept beside it); a `TaskError` naming the bad fields (never
    their values) otherwise."""
    if not isinstance(data, dict):
        return TaskError(source, "not a mapping of RolloutRequest fields")
    data = dict(data)
    split = data.pop("split", None)  # where a server's task set files it (`tasks.catalog`), not a request field
    if split is not None and not isinstance(split, str):
        return TaskError(source, "split must be a string")
    try:
        request = RolloutRequest.model_validate(data)
    except ValidationError as exc:
        return TaskError(source, f"invalid request: {validation_summary(exc)}")
    return LoadedTask(request, source, split=split)


def load_request_file(path: Path) -> LoadedTask | TaskError:
    """A JSON or YAML request file."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        return TaskError(str(path), f"cannot read: {getattr(exc, 'strerror', None) or exc}")
    except yaml.YAMLError as exc:
        return TaskError(str(path), f"not valid JSON or YAML: {str(exc).splitlines()[0]}")
    return parse_request(data, str(path))


def read_jsonl(path: Path) -> Iterator[LoadedTask | TaskError]:
    """Each non-blank line of a JSONL file as a request, read one line at a time; a bad line is an error
    naming `path:LINE` and the rest go on."""
    try:
        handle = path.open(encoding="utf-8", errors="replace")
    except OSError as exc:
        yield TaskError(str(path), f"cannot read: {exc.strerror or exc}")
        return
    with handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            source = f"{path}:{number}"
            try:
                data = json.loads(line)
            except ValueError as exc:
                yield TaskError(source, f"not JSON: {exc}")
                continue
            yield parse_request(data, source)
