"""The wire dialects an agent may speak to the relay besides chat completions: one module each, and this registry.

Each module (pure: no I/O) holds everything about its dialect as one `Dialect` object, `DIALECT` (see
`dialects.base`): its paths, translation to and from chat completions, the stream translator, the read-back of
its own answers, pass-through to an upstream that serves it, end-of-stream detection and error shapes.
`dialects.chat` is the chat-completions side they share.

Adding a dialect: one module here with its `Dialect`, and one line in `DIALECTS` below. (Its name is also one of
`settings.dialects.NativeDialect`, which the settings and the wire models spell out for their schema:
tests/llm/dialects/test_registry.py fails until it is there.)
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache

from coding_agent_env.llm.dialects import anthropic, google, responses
from coding_agent_env.llm.dialects.base import (
    Dialect,
    DialectError,
    NativeRequest,
    Recorder,
    Route,
    StreamTranslator,
)

__all__ = [
    "DIALECTS",
    "Dialect",
    "DialectError",
    "NativeRequest",
    "Recorder",
    "Route",
    "StreamTranslator",
    "agent_headers",
    "key_headers",
    "route_of",
]

DIALECTS: Mapping[str, Dialect] = {dialect.name: dialect for dialect in (
    anthropic.DIALECT,
    responses.DIALECT,
    google.DIALECT,
)}
"""Every dialect, by name."""


def route_of(path: str) -> Route | None:
    """The route of a POST to `path` (trailing slash removed) in some dialect; None for chat completions and the
    rest."""
    for dialect in DIALECTS.values():
        found = dialect.match(path)
        if found is not None:
            return found
    return None


@cache  # the registry never changes; the relay asks on every call that carries its token in a key header
def key_headers() -> tuple[str, ...]:
    """The headers besides `Authorization: Bearer` that clients send a key (the relay token) in."""
    return tuple(dict.fromkeys(d.key_header for d in DIALECTS.values() if d.key_header is not None))


@cache
def agent_headers() -> frozenset[str]:
    """Every agent header some dialect reads (lower case): the key headers and those forwarded on pass-through."""
    passed = {header for dialect in DIALECTS.values() for header in dialect.passed_headers}
    return frozenset(header.lower() for header in {*key_headers(), *passed})
