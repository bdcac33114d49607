"""Endpoint catalog: which upstream a rollout's LLM calls go to, and with which key.

`resolve_upstream(request, settings)` is pure: it reads only its arguments. Precedence is explicit argument
(the request's `base_url`/`endpoint`/`model`/`api_key`) > environment (what `Settings.from_env` read) >
built-in default. Rules (INTEGRITY.md 3-4):

- a server-held key is only ever paired with the base URL it was configured with;
- a caller-supplied `base_url` needs a caller-supplied key;
- the key travels in `Upstream.api_key` (a `SecretStr`) and nowhere else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from pydantic import SecretStr

from coding_agent_env.errors import EndpointError, UnknownEndpointError
from coding_agent_env.models import Mode, RolloutRequest
from coding_agent_env.settings import LlmEndpoint, Settings

__all__ = ["Upstream", "catalog", "resolve_upstream"]

_GENERIC_THINKING_OFF: dict[str, Any] = {"chat_template_kwargs": {"enable_thinking": False}}


@dataclass(frozen=True)
class Upstream:
    """Where one rollout's LLM calls go and how they are rewritten on the way.

    `repr()` never shows the key. `endpoint` is the catalog name, or None for a caller-supplied base URL.
    """

    base_url: str
    api_key: SecretStr | None
    model: str | None
    mode: Mode = Mode.BLACK_BOX
    max_tokens_cap: int | None = None
    disable_thinking: bool = False
    top_logprobs: int = 0
    token_ids: bool = False
    disable_thinking_body: dict[str, Any] = field(default_factory=lambda: dict(_GENERIC_THINKING_OFF))
    endpoint: str | None = None
    native_dialects: frozenset[str] = frozenset()
    """Agent dialects the upstream serves itself (calls in them are passed through, see `llm.answers`)."""
    engine: str | None = None
    """The inference engine serving `base_url` (`llm.engines`); None: detected from its answers."""
    policy_version: str | None = None
    """The trainer's policy / weight version serving the rollout (the request's `policy_version`): what each turn
    records unless the engine reports its own for the call. The lease starts from it and may be moved on
    (`Lease.set_policy_version`)."""

    def __post_init__(self) -> None:
        _check_url(self.base_url)
        if isinstance(self.api_key, str):  # accept a plain string, keep a SecretStr
            object.__setattr__(self, "api_key", SecretStr(self.api_key))

    @property
    def chat_url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"

    def secret(self) -> str | None:
        """The key's value, for the Authorization header and for redaction only."""
        return self.api_key.get_secret_value() if self.api_key is not None else None


def catalog(settings: Settings) -> dict[str, LlmEndpoint]:
    """The built-in entries (`openai`, `vllm`, `hf_router`) with operator entries layered on top."""
    entries = {
        "openai": LlmEndpoint(
            base_url=settings.openai_base_url,
            api_key=settings.openai_api_key,
            default_model=settings.openai_model,
            disable_thinking_body={},
        ),
        "vllm": LlmEndpoint(
            base_url=settings.vllm_endpoint_url,
            api_key=settings.vllm_api_key,
            default_model=settings.vllm_model,
            needs_key=False,
            token_ids=True,
            disable_thinking_default=True,
        ),
        "hf_router": LlmEndpoint(
            base_url=settings.hf_router_base_url,
            api_key=settings.hf_router_api_key or settings.hf_token,
            default_model=settings.hf_router_model,
        ),
    }
    entries.update(settings.llm_endpoints)
    return entries


def resolve_upstream(request: RolloutRequest, settings: Settings) -> Upstream:
    """Turn a request's endpoint fields into an `Upstream`; `EndpointError` for a combination we refuse."""
    caller_key = request.api_key
    entries = catalog(settings)
    if request.base_url is not None:
        if caller_key is None:
            raise EndpointError("a caller-supplied base_url requires a caller-supplied api_key")
        # With an endpoint name too (as OpenEnv's clients may send), the caller's URL and key win and the entry
        # gives only the defaults of model and thinking: its server-held key never goes to the caller's URL.
        named = _entry(entries, request.endpoint) if request.endpoint is not None else None
        model = request.model or (named.default_model if named is not None else None)
        if model is None:
            raise EndpointError("a caller-supplied base_url requires a model")
        return _upstream(
            request, request.base_url, caller_key, model, token_ids=True, endpoint=None,
            thinking_default=named.disable_thinking_default if named is not None else False,
            native=request.native_dialects,
        )
    name = request.endpoint or settings.llm_default_endpoint
    if name is None:
        raise EndpointError("no LLM endpoint: give endpoint, or base_url + api_key + model")
    entry = _entry(entries, name)
    key = caller_key if caller_key is not None else entry.api_key
    if key is None and entry.needs_key:
        raise EndpointError(f"endpoint {name!r} has no server-held key here; pass api_key")
    model = request.model or entry.default_model
    if model is None:
        raise EndpointError(f"endpoint {name!r} has no default model; pass model")
    return _upstream(
        request, entry.base_url, key, model, token_ids=entry.token_ids, endpoint=name,
        thinking=entry.disable_thinking_body, thinking_default=entry.disable_thinking_default,
        native=request.native_dialects or entry.native_dialects, engine=entry.engine,
    )


def _entry(entries: dict[str, LlmEndpoint], name: str) -> LlmEndpoint:
    entry = entries.get(name)
    if entry is None:
        raise UnknownEndpointError(f"unknown LLM endpoint {name!r}; this server offers: {', '.join(sorted(entries))}")
    return entry


def _upstream(
    request: RolloutRequest,
    base_url: str,
    key: SecretStr | None,
    model: str,
    *,
    token_ids: bool,
    endpoint: str | None,
    thinking: dict[str, Any] | None = None,
    thinking_default: bool = False,
    native: Sequence[str] = (),
    engine: str | None = None,
) -> Upstream:
    try:
        return Upstream(
            base_url=base_url,
            api_key=key,
            model=model,
            mode=request.mode,
            max_tokens_cap=request.max_tokens_cap,
            disable_thinking=thinking_default if request.disable_thinking is None else request.disable_thinking,
            top_logprobs=request.top_logprobs,
            token_ids=token_ids,
            disable_thinking_body=dict(_GENERIC_THINKING_OFF if thinking is None else thinking),
            endpoint=endpoint,
            native_dialects=frozenset(native),
            engine=engine,
            policy_version=request.policy_version,
        )
    except ValueError as exc:
        raise EndpointError(str(exc)) from None


def _check_url(url: str) -> None:
    """Only absolute http(s) URLs without credentials in them."""
    try:
        parts = urlsplit(url)
        hostname = parts.hostname
    except ValueError:
        raise ValueError("LLM base URL is malformed") from None
    if parts.username is not None or parts.password is not None:
        raise ValueError("LLM base URL must not carry credentials; pass api_key")
    if parts.scheme not in ("http", "https") or not hostname:
        raise ValueError("LLM base URL must be an absolute http(s) URL")
