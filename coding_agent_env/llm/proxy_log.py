"""The relay's log of one rollout's calls, one line per call, rendered from its recorded turns.

This is what OpenEnv's `opencode_env` / `pi_env` return as `proxy_log_tail` (there, the tail of an in-sandbox
proxy's log): a person reading a result sees at a glance which calls failed, how long each took and how many
tokens it used, without opening the turns. Only the tail is kept; a line never holds message text.
"""

from __future__ import annotations

from collections.abc import Sequence

from coding_agent_env.models import Turn

__all__ = ["proxy_log"]


def proxy_log(turns: Sequence[Turn], max_chars: int) -> str:
    """The last `max_chars` characters of the log of `turns` (whole lines only)."""
    lines: list[str] = []
    size = 0
    for turn in reversed(turns):
        line = _line(turn)
        if size + len(line) + 1 > max_chars:
            break
        lines.append(line)
        size += len(line) + 1
    return "\n".join(reversed(lines))


def _line(turn: Turn) -> str:
    parts = [f"turn {turn.turn}", str(turn.upstream_status) if turn.upstream_status is not None else "-"]
    parts.append("stream" if turn.stream else "whole")
    parts.append(f"{turn.latency_s:.3f}s")
    if turn.model:
        parts.append(f"model={turn.model}")
    if turn.finish_reason:
        parts.append(f"finish={turn.finish_reason}")
    if turn.usage is not None:
        parts.append(f"prompt_tokens={turn.usage.prompt_tokens} completion_tokens={turn.usage.completion_tokens}")
    if turn.completion_token_ids:
        parts.append(f"token_ids={len(turn.completion_token_ids)}")
    if turn.per_token_logps:
        parts.append(f"logprobs={len(turn.per_token_logps)}")
    if turn.error:
        parts.append(f"error={turn.error[:300]!r}")
    return " ".join(parts)
