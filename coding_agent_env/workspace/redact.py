"""Remove known secret values from every text that leaves the server, and make each one encodable."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["REDACTED", "Redactor", "encodable"]

REDACTED = "[REDACTED]"
_MIN_SECRET_CHARS = 4
"""Shorter values would redact ordinary text; no real key is this short."""


class Redactor:
    def __init__(self, secrets: Iterable[str | None]) -> None:
        self._secrets = sorted({s for s in secrets if s and len(s) >= _MIN_SECRET_CHARS}, key=len, reverse=True)

    @property
    def secrets(self) -> list[str]:
        return list(self._secrets)

    def text(self, value: str) -> str:
        for secret in self._secrets:
            if secret in value:
                value = value.replace(secret, REDACTED)
        return encodable(value)

    def deep(self, value: Any) -> Any:
        """Redact every string inside JSON-like data (dicts, lists, strings), and make it encodable."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.deep(k): self.deep(v) for k, v in value.items()}
        if isinstance(value, list):
            # Token ids, logprobs and masks are long lists of numbers: checked in C, copied, never walked.
            if _NUMBERS.issuperset(map(type, value)):
                return list(value)
            return [self.deep(v) for v in value]
        return value


_NUMBERS = frozenset((int, float))


def encodable(value: str) -> str:
    """`value` with each lone surrogate replaced by `?`. JSON may carry them (`"\\ud800"`), so a model's text
    can hold them, and no UTF-8 encoder takes them: one in a result would make it impossible to send."""
    if value.isascii():
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "replace").decode("utf-8")
    return value
