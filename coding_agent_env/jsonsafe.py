"""Bounded JSON parsing for text a sandbox (or an agent) wrote: total, linear, never a deep recursion.

`loads` takes at most `max_chars` characters nested at most `max_depth` deep and raises `ValueError` with the
reason, and only `ValueError`, for anything else: the callers turn that reason into a note or a malformed
count, never a traceback. Standard library only; every layer may import it.
"""

from __future__ import annotations

import json

__all__ = ["loads", "nesting_exceeds"]


def nesting_exceeds(text: str, limit: int) -> bool:
    """Whether brackets outside JSON strings nest deeper than `limit`. Linear, no recursion."""
    depth = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                return True
        elif char in "]}":
            depth -= 1
    return False


def loads(text: str, *, max_chars: int, max_depth: int) -> object:
    """`json.loads(text)` within the bounds; ValueError with the reason otherwise (and only ValueError)."""
    if not isinstance(text, str):
        raise ValueError("not text")
    if len(text) > max_chars:
        raise ValueError(f"longer than {max_chars} characters")
    if nesting_exceeds(text, max_depth):
        raise ValueError(f"nested deeper than {max_depth} levels")
    try:
        return json.loads(text)
    except ValueError:
        raise ValueError("not JSON") from None
    except Exception as exc:  # noqa: BLE001 - the contract: a reason, never another exception
        # Bounded above, so not expected (a RecursionError, say); kept so that a gap in the bounds is a
        # reason, never a traceback.
        raise ValueError(f"not JSON ({type(exc).__name__})") from None
