"""One relayed call in flight and the `Turn` it becomes.

A `RelayedCall` is made when the relay has an agent's request (as chat completions: the request itself, or its
translation) and is handed to the lease, whatever happened, once the call is over (`exchange` does that). What
the exchange learns goes into it: the upstream's status, the answer (fed to `assembler`), the error.

In `transparent_proxy` mode the call's engine (`llm.engines`: the endpoint's, or the one detected for its base
URL) says what is added to ask for ids and logprobs, and whether a streamed call must go upstream not streamed
(`buffered`: the engine refuses the combination; the relay streams the answer to the agent). An error answer
that an engine recognises as its refusal of what the relay added reroutes the call once (`reroute`), in the
form that engine accepts; `how` says how the call was made when not as the agent asked.

The turn's policy version is the one the engine reported for the call (its answer's `X-Policy-Version` header,
checked by `policy_version_or_none`: a value too long or not visible ASCII is ignored; else a body field its
adapter reads), else the lease's when the call started. A header line over aiohttp's own limit (8190 bytes) is
not an answer at all: the call fails as `upstream unreachable`, as for any header.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from coding_agent_env.llm import engines
from coding_agent_env.llm.capture import TurnAssembler
from coding_agent_env.llm.lease import Lease, PromptDelta
from coding_agent_env.llm.rewrite import rewrite_request
from coding_agent_env.models import Mode, Turn
from coding_agent_env.models.turns import policy_version_or_none
from coding_agent_env.settings import Settings

__all__ = ["POLICY_VERSION_HEADER", "RelayedCall"]

POLICY_VERSION_HEADER = "X-Policy-Version"
"""The upstream answer's header that names the policy / weight version which produced it."""

_ADDED_FIELDS = ("return_token_ids", "return_prompt_token_ids", "return_meta_info", "top_logprobs", "logprobs",
                 "stream_options")
"""Fields the relay may add or change (besides the model and token caps): a refusal naming one is ours."""


class RelayedCall:
    """One call in flight and what its turn is made of. `body` is the chat-completions request (rewritten for the
    upstream: what goes there unless the call is passed through); `passthrough` names the dialect of a call sent
    upstream as the agent wrote it."""

    def __init__(self, lease: Lease, body: dict[str, Any], settings: Settings,
                 passthrough: str | None = None) -> None:
        self.lease = lease
        self.settings = settings
        self.prompt: PromptDelta = lease.begin(body.get("messages"), body.get("tools"))
        upstream = lease.upstream
        self.transparent = upstream.mode is Mode.TRANSPARENT_PROXY and passthrough is None
        self.engine = engines.engine_for(upstream.base_url, upstream.engine) if self.transparent else engines.GENERIC
        self._request = body
        self.body = rewrite_request(body, upstream, self.engine)
        self.stream = self.body.get("stream") is True
        """Whether the agent asked for a stream (and gets one)."""
        self.buffered = False
        """Sent upstream not streamed although the agent streams (the engine refuses the streamed form)."""
        self.how: str | None = None
        """How the call was made when not as the agent asked (not streamed, rerouted after a refusal)."""
        self.rerouted: str | None = None
        """The refusal of what the relay added that made it call again (status: message)."""
        self.prompt_ids_source: str | None = None
        """Where the prompt ids came from when not in the engine's answer (e.g. llama.cpp's tokenizer)."""
        self._buffer_if_refused()
        self.assembler = self._assembler()
        self.status: int | None = None
        self.error: str | None = None
        self.upstream_error: dict[str, Any] | None = None
        self.passthrough = passthrough
        self.rollout_version = lease.policy_version
        """The lease's policy version when the call started (a later update is for later calls)."""
        self.reported_version: str | None = None
        """The valid `X-Policy-Version` of the upstream's answer, if it had one."""
        self.timestamp = time.time()
        self.started = time.monotonic()
        self.ended: float | None = None
        self._secret = lease.upstream.secret()

    def redact(self, text: str) -> str:
        """`text` without the upstream's key (an upstream may echo it back in an error)."""
        if self._secret and self._secret in text:
            text = text.replace(self._secret, "[REDACTED]")
        return text

    def _assembler(self) -> TurnAssembler:
        detect = self.transparent and self.lease.upstream.engine is None
        return TurnAssembler(self.engine, detect_for=self.lease.upstream.base_url if detect else None)

    def _buffer_if_refused(self) -> None:
        if self.transparent and self.stream and self.engine.buffers(self.body):
            self.body["stream"] = False
            self.body.pop("stream_options", None)
            self.buffered = True
            self.how = (f"not streamed ({self.engine.name} refuses this request streamed); streamed to the agent by "
                        "the relay")

    def reroute(self, status: int, message: str) -> bool:
        """After an error answer: whether it refused what the relay added, and the call was made ready to go
        again in a form the upstream accepts (once per call; only in transparent_proxy mode)."""
        if not self.transparent or self.rerouted is not None or status < 400 or status >= 500:
            return False
        base_url = self.lease.upstream.base_url
        engine = engines.refused_by(base_url, status, message)
        if engine is None:
            if not any(field in message for field in _ADDED_FIELDS if field not in self._request):
                return False
            engine = engines.ENGINES["openai"]  # an API that knows no engine switch: logprobs only
        before = (self.engine, self.body, self.buffered, self.how)
        self.engine, self.buffered, self.how = engine, False, None
        self.body = rewrite_request(self._request, self.lease.upstream, engine)
        self._buffer_if_refused()
        if (self.body, self.buffered) == before[1:3]:  # nothing different to try
            self.engine, self.body, self.buffered, self.how = before
            return False
        engines.remember(base_url, engine)
        self.rerouted = f"{status}: {message}"[:500]
        again = f"again after the upstream refused what the relay added ({self.rerouted})"
        self.how = f"{self.how}; {again}" if self.how else again
        self.assembler = self._assembler()
        self.status, self.error, self.upstream_error, self.reported_version = None, None, None, None
        return True

    def answered(self, status: int, headers: Mapping[str, str]) -> None:
        """The upstream answered with `status` and `headers`: keep the status and its policy version, if valid
        (an untrusted value: never raises)."""
        self.status = status
        self.reported_version = policy_version_or_none(headers.get(POLICY_VERSION_HEADER))

    def headers(self) -> dict[str, str]:
        """The headers of the chat-completions request upstream: the server-held key as a bearer token."""
        accept = "text/event-stream" if self.stream and not self.buffered else "application/json"
        headers = {"Content-Type": "application/json", "Accept": accept}
        if self._secret is not None:
            headers["Authorization"] = f"Bearer {self._secret}"
        return headers

    def done(self) -> None:
        """The call is over: keep only the prompt delta (never the whole request) and hand the turn to the lease."""
        if self.ended is not None:
            return
        self.ended = time.monotonic()
        self.body = {}
        self._request = {}
        self.lease.record(self)

    def facts(self) -> dict[str, Any]:
        """How the call was made, for the turn: the engine, how it was called, where its prompt ids came from."""
        known = self.transparent and self.assembler.engine is not engines.GENERIC
        return {
            "engine": self.assembler.engine.name if known else self.lease.upstream.engine,
            "upstream_call": self.how,
            "prompt_ids_source": self.prompt_ids_source or ("engine" if self.assembler.prompt_token_ids else None),
        }

    def turn(self) -> Turn:
        a = self.assembler
        message = a.message()
        if self._secret and message.content and self._secret in message.content:
            message = message.model_copy(update={"content": self.redact(message.content)})
        return Turn(
            turn=self.prompt.index,
            stream=self.stream,
            request_messages_reused=self.prompt.reused,
            request_messages=self.prompt.messages,
            request_tools=self.prompt.tools,
            request_tools_reused=self.prompt.tools_reused,
            model=a.model,
            message=message,
            finish_reason=a.finish_reason,
            usage=a.usage,
            latency_s=round((self.ended or time.monotonic()) - self.started, 6),
            timestamp=round(self.timestamp, 6),
            upstream_status=self.status,
            upstream_error=self.upstream_error or ({"message": self.error} if self.error else None),
            error=self.error,
            passthrough=self.passthrough,  # type: ignore[arg-type]  # a registered dialect's name
            policy_version=(self.reported_version or policy_version_or_none(a.policy_version)
                            or self.rollout_version),
            prompt_token_ids=a.prompt_token_ids,
            completion_token_ids=a.sampled_ids(),
            completion_tokens=a.tokens or [],
            per_token_logps=a.logprobs or [],
            **{name: value for name, value in self.facts().items() if name in Turn.model_fields},
        )
