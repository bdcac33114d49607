"""What the relay changes in an agent's chat-completion request before forwarding it.

Pure functions over the parsed JSON body. The model id is passed through untouched (namespaced ids such as
`Qwen/Qwen3-4B` stay intact) unless the rollout's upstream pins one.
"""

from __future__ import annotations

from typing import Any

from coding_agent_env.llm.engines import GENERIC, Engine
from coding_agent_env.llm.upstream import Upstream
from coding_agent_env.models import Mode

__all__ = ["rewrite_request"]

_TOKEN_LIMIT_FIELDS = ("max_tokens", "max_completion_tokens")


def rewrite_request(body: dict[str, Any], upstream: Upstream, engine: Engine = GENERIC) -> dict[str, Any]:
    """Return the body to send upstream (a shallow copy of `body`; `body` itself is not modified).

    - `model`: the upstream's model when it has one;
    - `max_tokens_cap`: every token-limit field present is lowered to the cap; with none present,
      `max_tokens` is set to the cap;
    - `disable_thinking`: the endpoint's switch is merged in;
    - streaming: usage is always requested (`stream_options.include_usage`) so streamed turns carry it;
    - `transparent_proxy`: what `engine` needs to return logprobs (with `top_logprobs`) and token ids
      (`llm.engines`: vLLM's `return_token_ids` where supported, SGLang's extensions, llama.cpp's logprobs).
    """
    out = dict(body)
    if upstream.model is not None:
        out["model"] = upstream.model
    if upstream.max_tokens_cap is not None:
        _cap_tokens(out, upstream.max_tokens_cap)
    if upstream.disable_thinking:
        _merge(out, upstream.disable_thinking_body)
    if out.get("stream") is True:
        options = out.get("stream_options")
        out["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    if upstream.mode is Mode.TRANSPARENT_PROXY:
        engine.ask(out, top_logprobs=upstream.top_logprobs, token_ids=upstream.token_ids)
    return out


def _cap_tokens(body: dict[str, Any], cap: int) -> None:
    present = [name for name in _TOKEN_LIMIT_FIELDS if name in body]
    for name in present:
        value = body[name]
        if not isinstance(value, int) or isinstance(value, bool) or value > cap or value <= 0:
            body[name] = cap
    if not present:
        body["max_tokens"] = cap


def _merge(body: dict[str, Any], extra: dict[str, Any]) -> None:
    """Merge `extra` into `body`, one level of nested dicts deep (e.g. `chat_template_kwargs`)."""
    for key, value in extra.items():
        current = body.get(key)
        if isinstance(value, dict) and isinstance(current, dict):
            body[key] = {**current, **value}
        else:
            body[key] = value
