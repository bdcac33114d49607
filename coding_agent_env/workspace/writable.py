"""Whether a request's file texts can be written at all, checked before anything starts.

JSON carries lone surrogates (`"\\ud800"`), and the request model accepts them in file contents. A file is
written as UTF-8 with surrogate escapes (`Sandbox.write_text`: U+DC80..U+DCFF stand for the raw bytes 0x80..0xFF),
so any other lone surrogate is text no file can hold. Found only when provision writes it, it would be an
exception out of the rollout; found here, it is the caller's precise error, and nothing ran.
"""

from __future__ import annotations

from collections.abc import Mapping

from coding_agent_env.errors import InvalidTaskError
from coding_agent_env.models import Task

__all__ = ["check_writable"]


def check_writable(request: Task) -> None:
    """`InvalidTaskError` naming the first file (of `files`, then `verify_files`) whose text holds a lone
    surrogate a file cannot hold, and where; never the text itself (it may be a secret)."""
    for field, files in (("files", request.files), ("verify_files", request.verify_files)):
        problem = _first_unwritable(files)
        if problem is not None:
            path, at, char = problem
            raise InvalidTaskError(
                f"{field}[{path!r}] is not valid Unicode text: it holds a lone surrogate (U+{ord(char):04X} at "
                f"character {at})"
            )


def _first_unwritable(files: Mapping[str, str]) -> tuple[str, int, str] | None:
    for path, text in files.items():
        try:
            text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError as exc:
            return path, exc.start, text[exc.start]
    return None
