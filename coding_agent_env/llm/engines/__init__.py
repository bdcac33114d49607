"""Inference engine adapters: how each engine is asked for token ids and logprobs, where they come back, and
what it refuses. One module per engine (`vllm`, `sglang`, `llamacpp`, `openai`: no ids), one line each in
`ENGINES`.

The engine of a call is its endpoint's (`LlmEndpoint.engine`, carried as `Upstream.engine`), else the one
detected from an earlier answer of the same base URL (cached for the process), else none: `GENERIC`, what the
relay always did (vLLM's fields, `return_token_ids` only where the endpoint says it understands it). An error
answer that an engine recognises as its refusal of what the relay added also detects it (and the call is
retried in the form that engine accepts, see `llm.exchange`).
"""

from __future__ import annotations

from typing import Any

from coding_agent_env.llm.engines import llamacpp, openai, sglang, vllm
from coding_agent_env.llm.engines.base import Engine, IdsFound, PromptIdsRequest

__all__ = ["ENGINES", "GENERIC", "Engine", "IdsFound", "PromptIdsRequest", "detect", "engine_for", "forget",
           "refused_by", "remember"]

ENGINES: dict[str, Engine] = {engine.name: engine for engine in (
    vllm.ENGINE,
    sglang.ENGINE,
    llamacpp.ENGINE,
    openai.ENGINE,
)}
GENERIC: Engine = vllm.GENERIC

_DETECTED: dict[str, Engine] = {}
"""base URL -> engine, learnt from answers (bounded: one entry per distinct upstream base URL)."""
_MAX_DETECTED = 4096
_DETECTABLE = (llamacpp.ENGINE, sglang.ENGINE, vllm.GENERIC)
"""vLLM recognised but not configured stays `GENERIC` (its fields, `return_token_ids` only where the endpoint
says): a router in front of it may refuse what vLLM itself takes."""


def engine_for(base_url: str, configured: str | None) -> Engine:
    """The engine of a call to `base_url`: configured, else detected earlier, else `GENERIC`."""
    if configured is not None:
        return ENGINES.get(configured, GENERIC)
    return _DETECTED.get(base_url, GENERIC)


def detect(base_url: str, obj: Any) -> Engine | None:
    """Learn `base_url`'s engine from one of its answers (or chunks), if it says; the engine, or None."""
    if not isinstance(obj, dict) or base_url in _DETECTED:
        return None
    for engine in _DETECTABLE:
        if engine.detects(obj):
            remember(base_url, engine)
            return engine
    return None


def refused_by(base_url: str, status: int, message: str) -> Engine | None:
    """The engine whose known refusal of what the relay added `message` is (remembered for `base_url`)."""
    for engine in _DETECTABLE:
        if engine.refusal_is_ours(status, message):
            remember(base_url, engine)
            return engine
    return None


def forget(base_url: str | None = None) -> None:
    """Drop what was detected (for one base URL, or all): for tests, and an endpoint that changed engine."""
    if base_url is None:
        _DETECTED.clear()
    else:
        _DETECTED.pop(base_url, None)


def remember(base_url: str, engine: Engine) -> None:
    """`base_url`'s engine from now on (unless its endpoint says another)."""
    if len(_DETECTED) >= _MAX_DETECTED:
        _DETECTED.clear()
    _DETECTED[base_url] = engine
