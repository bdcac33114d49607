"""Text the results store can hold, whatever a result carries.

Neither database takes every Python string: PostgreSQL refuses NUL in a text value, and no UTF-8 database (nor
file) holds a lone surrogate (a task id read from JSON, a file name with undecodable bytes). A value holding
either is stored in its column *escaped* (each such character as `\\uXXXX` text: what filters and group-bys
see), and its exact value beside it in the row's `exact` column (JSON, ASCII only: every database holds it), from
which every read restores it. A value without them is stored as it is and `exact` stays NULL, so rows written
before this column existed read back unchanged.

The whole result is stored as JSON text in which NUL and lone surrogates are escapes (`\\u0000`, `\\ud800`), so
it round-trips too; it is read back with `json.loads` (pydantic's JSON parser refuses a lone-surrogate escape).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from coding_agent_env.models import RolloutResult

__all__ = ["dump_result", "escaped", "exact_json", "load_result", "restored"]

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
"""NUL (PostgreSQL's text refuses it) and lone surrogates (UTF-8 cannot encode them). A Python `str` never
holds a valid surrogate *pair* as two characters of one text it decoded, so each match is alone."""


def _escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def escaped(value: str) -> str:
    """`value` as a column holds it: unchanged unless it holds NUL or a lone surrogate, each of which becomes
    its `\\uXXXX` text."""
    return _UNSTORABLE.sub(_escape, value)


def exact_json(values: Mapping[str, str]) -> str | None:
    """The `exact` column for a row whose text columns are `values`: a JSON object of those whose stored form
    differs (ASCII JSON, storable anywhere), or None when every one is stored as it is."""
    changed = {column: value for column, value in values.items() if _UNSTORABLE.search(value)}
    return json.dumps(changed, ensure_ascii=True) if changed else None


def restored(column: str, stored: Any, exact: str | None) -> Any:
    """A column's value as it was given: from the row's `exact` column when it holds it, else as stored."""
    if exact is None:
        return stored
    value = json.loads(exact).get(column)
    return stored if value is None else value


def dump_result(result: RolloutResult, indent: int | None = None) -> str:
    """The result as storable (and printable) JSON text. Pydantic's encoder writes NUL as `\\u0000` but refuses
    a lone surrogate; such a result (rare: the rollout pipeline's redaction pass removes them) goes through
    `json`, which escapes it."""
    try:
        return result.model_dump_json(indent=indent)
    except ValueError:  # PydanticSerializationError: a lone surrogate somewhere in it
        separators = (",", ":") if indent is None else None
        return json.dumps(result.model_dump(mode="json"), ensure_ascii=True, indent=indent, separators=separators)


def load_result(text: str) -> RolloutResult:
    """A stored result (from `dump_result`), exact."""
    return RolloutResult.model_validate(json.loads(text))
