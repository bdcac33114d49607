"""Wire dialects an agent may speak to the relay, each translated to and from the upstream's chat completions:
one module per dialect, pure (no I/O): `anthropic` (Messages), `responses` (OpenAI Responses), `google`
(generateContent). `Dialect` is what the relay's forwarder needs of one: the whole-response translation, a
stream translator per call, and the dialect's error shapes."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from coding_agent_env.llm.dialects import anthropic, google, responses

__all__ = ["ANTHROPIC", "GOOGLE", "RESPONSES", "Dialect", "StreamTranslator"]


class StreamTranslator(Protocol):
    def feed(self, chunk: dict[str, Any]) -> bytes: ...

    def finish(self) -> bytes: ...


@dataclass(frozen=True)
class Dialect:
    name: str
    response: Callable[[dict[str, Any], str | None], dict[str, Any]]
    """A whole chat completion (and the requested model) -> the dialect's response body."""
    stream: Callable[[str | None], StreamTranslator]
    """A translator for one streamed call (the requested model)."""
    error_body: Callable[[int, str], dict[str, Any]]
    """The dialect's error body for a status and message."""
    stream_error: Callable[[dict[str, Any]], bytes]
    """An error body as the event that ends a stream in this dialect."""


ANTHROPIC = Dialect("anthropic", anthropic.response_from_chat, anthropic.AnthropicStream, anthropic.error_body,
                    lambda body: f"event: error\ndata: {json.dumps(body)}\n\n".encode())
RESPONSES = Dialect("responses", responses.response_from_chat, responses.ResponsesStream, responses.error_body,
                    lambda body: f"event: error\ndata: {json.dumps({'type': 'error', **body['error']})}\n\n".encode())
GOOGLE = Dialect("google", google.response_from_chat, google.GoogleStream, google.error_body,
                 lambda body: f"data: {json.dumps(body)}\n\n".encode())
