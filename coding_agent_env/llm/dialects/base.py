"""What the relay knows about one wire dialect an agent may speak besides chat completions: one `Dialect` object.

A dialect module (one per dialect, pure: no I/O) defines a `Dialect` subclass and one instance of it, `DIALECT`,
listed in the registry (`llm.dialects.DIALECTS`). Everything the relay asks of a dialect is here:

- which POSTs are its: `match(path)` -> a `Route` (with what the path itself says: Google's model, streaming);
- translation over a chat-completions upstream: `to_chat(body, route)` (`DialectError` for what cannot be
  translated), `response(chat, model)` for a whole answer, `stream(model)` a `StreamTranslator` per streamed call;
- the read-back of its own answers as a chat completion, to record a call passed through: `read(body)` for a
  whole answer, `recorder()` fed each streamed event, `ends(event)` whether an event closes a whole stream;
- pass-through to an upstream that serves it natively: `native(route, query, body, upstream, agent_headers)` ->
  `NativeRequest`, from the class's `key_header`, `passed_headers`, `model_field`, `token_cap_field` and
  `resource` (or its `upstream_path`);
- its error shapes: `error_body(status, message)`, and `stream_error(body)` as the event that ends a stream.

Read-backs are total: any JSON may be fed; what cannot be read stays empty. Their result is what
`capture.TurnAssembler.add_response` reads: `model`, one choice with `message` (`content`, `reasoning_content`,
`tool_calls` with JSON-string arguments), `finish_reason` in chat's words, and `usage`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    from coding_agent_env.llm.upstream import Upstream

__all__ = ["Dialect", "DialectError", "NativeRequest", "Recorder", "Route", "StreamTranslator", "refuse_unknown"]


class DialectError(ValueError):
    """A request that cannot be translated; the message says which field and why."""


def refuse_unknown(body: dict[str, Any], known: frozenset[str], what: str) -> None:
    """`DialectError` naming every field of `body` outside `known` (a field the translation would drop silently
    could change what the agent asked for)."""
    unknown = sorted(set(body) - known)
    if unknown:
        raise DialectError(f"unsupported {what} field(s): {', '.join(unknown)}")


class StreamTranslator(Protocol):
    """Chat-completion chunks in, the dialect's stream events (SSE bytes) out; one per streamed call."""

    def feed(self, chunk: dict[str, Any]) -> bytes: ...

    def finish(self) -> bytes:
        """The closing events of a whole answer (idempotent: the second call returns nothing)."""
        ...


class Recorder(Protocol):
    """The dialect's streamed events in (each the JSON of one SSE `data:` line), the call's chat completion out."""

    def feed(self, event: Any) -> None: ...

    def completion(self) -> dict[str, Any]:
        """The chat completion so far (a stream cut short gives what it had)."""
        ...


@dataclass(frozen=True)
class Route:
    """A POST that is `dialect`'s, and what its path says: the model and whether it streams (None: the path does not
    say; the body does)."""

    dialect: Dialect
    model: str | None = None
    streamed: bool | None = None


@dataclass(frozen=True)
class NativeRequest:
    """What goes upstream for a call passed through."""

    url: str
    headers: dict[str, str]
    body: dict[str, Any]
    stream: bool


class Dialect(ABC):
    """One wire dialect; see the module docstring. Instances are stateless and shared by every call."""

    name: ClassVar[str]
    """The dialect's name: `Turn.passthrough` and `native_dialects` (`settings.dialects.NativeDialect`) use it."""
    paths: ClassVar[frozenset[str]] = frozenset()
    """The relay paths that are this dialect's (a dialect with paths that carry data overrides `match`)."""
    key_header: ClassVar[str | None] = None
    """The header its clients send the key in (the relay token from agents, the server's key upstream on
    pass-through); None: `Authorization: Bearer`."""
    passed_headers: ClassVar[Mapping[str, str | None]] = {}
    """Agent headers forwarded upstream on pass-through, each with the value sent when the agent sent none (None:
    then not sent)."""
    model_field: ClassVar[str | None] = "model"
    """The body field the upstream's model goes into on pass-through; None: the model travels in the URL."""
    token_cap_field: ClassVar[tuple[str, ...]]
    """The body field, as a path of keys, that `max_tokens_cap` lowers on pass-through."""
    last_events: ClassVar[frozenset[str]] = frozenset()
    """The event `type`s that end a whole stream (a dialect whose events have no type overrides `ends`)."""
    resource: ClassVar[str] = ""
    """Where a call passed through goes, after the upstream's base URL (a dialect whose resource depends on the
    call overrides `upstream_path`)."""

    def match(self, path: str) -> Route | None:
        """This dialect's route for a POST to `path` (trailing slash removed), else None."""
        return Route(self) if path in self.paths else None

    @abstractmethod
    def to_chat(self, body: dict[str, Any], route: Route) -> dict[str, Any]:
        """The chat-completions request for a request in this dialect; `DialectError` for what cannot be translated."""

    @abstractmethod
    def response(self, chat: dict[str, Any], model: str | None) -> dict[str, Any]:
        """A whole chat completion (and the requested model) -> the dialect's response body."""

    @abstractmethod
    def stream(self, model: str | None) -> StreamTranslator:
        """A translator for one streamed call (the requested model)."""

    @abstractmethod
    def recorder(self) -> Recorder:
        """A read-back of one streamed answer in this dialect."""

    def read(self, body: Any) -> dict[str, Any]:
        """The chat completion for a whole answer in this dialect (by default: one event of its stream)."""
        one = self.recorder()
        one.feed(body)
        return one.completion()

    def ends(self, event: dict[str, Any]) -> bool:
        """Whether `event` is the last of a whole streamed answer."""
        return event.get("type") in self.last_events

    @abstractmethod
    def error_body(self, status: int, message: str) -> dict[str, Any]:
        """The dialect's error body for a status and message (which its clients turn into typed errors)."""

    @abstractmethod
    def stream_error(self, body: dict[str, Any]) -> bytes:
        """An error body as the event that ends a stream in this dialect."""

    def upstream_path(self, route: Route, model: str | None, query: Mapping[str, str]) -> str:
        """The resource a call passed through goes to, after the upstream's base URL (`model`: the upstream's, or
        the path's)."""
        return self.resource

    def streamed(self, route: Route, body: dict[str, Any]) -> bool:
        """Whether a call asks for a stream: by its path when the path says, else by `stream: true`."""
        return route.streamed if route.streamed is not None else body.get("stream") is True

    def native(self, route: Route, query: Mapping[str, str], body: dict[str, Any], upstream: Upstream,
               agent_headers: Mapping[str, str]) -> NativeRequest:
        """What goes upstream for an agent's call passed through: its body with the rollout's rules applied (the
        upstream's model, `max_tokens_cap`), the server-held key in the dialect's own header and the agent's
        `passed_headers`; never the relay token."""
        out = dict(body)
        if self.model_field is not None and upstream.model is not None:
            out[self.model_field] = upstream.model
        if upstream.max_tokens_cap is not None:
            _cap(out, self.token_cap_field, upstream.max_tokens_cap)
        headers = {"Content-Type": "application/json"}
        for header, default in self.passed_headers.items():
            value = agent_headers.get(header) or default
            if value:
                headers[header] = value
        secret = upstream.secret()
        if secret is not None:
            if self.key_header is None:
                headers["Authorization"] = f"Bearer {secret}"
            else:
                headers[self.key_header] = secret
        url = upstream.base_url.rstrip("/") + self.upstream_path(route, upstream.model or route.model, query)
        return NativeRequest(url, headers, out, self.streamed(route, body))


def _cap(body: dict[str, Any], field: tuple[str, ...], cap: int) -> None:
    """Lower `body`'s field at `field` (a path of keys) to `cap`, setting it when absent or not a positive int;
    objects on the way are copied, never changed in place (they are the agent's)."""
    *outer, last = field
    into = body
    for key in outer:
        inner = dict(into[key]) if isinstance(into.get(key), dict) else {}
        into[key] = inner
        into = inner
    value = into.get(last)
    into[last] = value if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= cap else cap
