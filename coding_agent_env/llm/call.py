"""One relayed call in flight and the `Turn` it becomes.

A `RelayedCall` is made when the relay has an agent's request (as chat completions: the request itself, or its
translation) and is handed to the lease, whatever happened, once the call is over (`exchange` does that). What
the exchange learns goes into it: the upstream's status, the answer (fed to `assembler`), the error.
"""

from __future__ import annotations

import time
from typing import Any

from coding_agent_env.llm.capture import TurnAssembler
from coding_agent_env.llm.lease import Lease, PromptDelta
from coding_agent_env.llm.rewrite import rewrite_request
from coding_agent_env.models import Turn
from coding_agent_env.settings import Settings

__all__ = ["RelayedCall"]


class RelayedCall:
    """One call in flight and what its turn is made of. `body` is the chat-completions request (rewritten for the
    upstream: what goes there unless the call is passed through); `passthrough` names the dialect of a call sent
    upstream as the agent wrote it."""

    def __init__(self, lease: Lease, body: dict[str, Any], settings: Settings,
                 passthrough: str | None = None) -> None:
        self.lease = lease
        self.settings = settings
        self.prompt: PromptDelta = lease.begin(body.get("messages"), body.get("tools"))
        self.body = rewrite_request(body, lease.upstream)
        self.stream = self.body.get("stream") is True
        self.assembler = TurnAssembler()
        self.status: int | None = None
        self.error: str | None = None
        self.upstream_error: dict[str, Any] | None = None
        self.passthrough = passthrough
        self.timestamp = time.time()
        self.started = time.monotonic()
        self.ended: float | None = None
        self._secret = lease.upstream.secret()

    def redact(self, text: str) -> str:
        """`text` without the upstream's key (an upstream may echo it back in an error)."""
        if self._secret and self._secret in text:
            text = text.replace(self._secret, "[REDACTED]")
        return text

    def headers(self) -> dict[str, str]:
        """The headers of the chat-completions request upstream: the server-held key as a bearer token."""
        accept = "text/event-stream" if self.stream else "application/json"
        headers = {"Content-Type": "application/json", "Accept": accept}
        if self._secret is not None:
            headers["Authorization"] = f"Bearer {self._secret}"
        return headers

    def done(self) -> None:
        """The call is over: keep only the prompt delta (never the whole request) and hand the turn to the lease."""
        self.ended = time.monotonic()
        self.body = {}
        self.lease.record(self)

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
            prompt_token_ids=a.prompt_token_ids,
            completion_token_ids=a.sampled_ids(),
            completion_tokens=a.tokens or [],
            per_token_logps=a.logprobs or [],
        )
