"""The names of the wire dialects an upstream may serve itself, spelled once for the two places that validate
them: the settings (an endpoint's `native_dialects`) and the wire models (`Turn.passthrough`, a request's
`native_dialects`). `llm.dialects` has one `Dialect` per name; tests/llm/dialects/test_registry.py fails when
the two disagree, so a new dialect is its module, its registry line and its name here."""

from __future__ import annotations

from typing import Literal

__all__ = ["NativeDialect"]

NativeDialect = Literal["anthropic", "responses", "google"]
"""Agent wire dialects other than chat completions, by the names the relay gives them."""
