"""Why a rollout's LLM calls failed, for its result's `error`, whatever the agent's exit code.

`llm_failure(turns, mode)` reads the recorded turns (pure) and names the failure an agent did not get past (its
last call failed, or a call failed and none succeeded after it), or any refusal of what the relay added (always
worth saying: it is ours). Kinds (`ErrorInfo.type`), stage `llm`:

- `LlmRewriteRefused`: the upstream refused a field the relay added (logprobs, token ids...): an infra error,
  ours, not the model's;
- `LlmUpstreamError`: the upstream failed (5xx, timeout, unreachable, a broken or unreadable answer; or 401,
  403, 404, 408, 429: its key, model or load): infra;
- `LlmRequestRefused`: the upstream refused the agent's own request (4xx: a prompt too long, say): the model's
  and agent's behaviour.

The message has the upstream status and its message, which call it was and how many failed. Calls the relay
ended because the agent went away or its phase ended (`client disconnected`, `lease closed`, `call cancelled`)
are not failures of the LLM.
"""

from __future__ import annotations

from collections.abc import Sequence

from coding_agent_env.llm.trace import CUT_ERRORS
from coding_agent_env.models import ErrorInfo, Mode, Turn

__all__ = ["llm_failure"]

_ADDED = ("logprobs", "top_logprobs", "return_token_ids", "return_prompt_token_ids", "return_meta_info",
          "stream_options")
_MAX_MESSAGE = 500
_UPSTREAM_SIDE = frozenset({401, 403, 404, 408, 429})
"""4xx answers that say the upstream (its key, its model name, its load), not the request, is at fault."""


def llm_failure(turns: Sequence[Turn], mode: Mode) -> ErrorInfo | None:
    """The failure of the rollout's LLM calls worth its `error`, or None."""
    ordered = sorted(turns, key=lambda turn: turn.turn)
    failed = [turn for turn in ordered if _failed(turn)]
    if not failed:
        return None
    rewrite = [turn for turn in failed if _kind(turn, mode) == "LlmRewriteRefused"]
    last_ok = max((turn.turn for turn in ordered if turn.upstream_status == 200 and turn.error is None), default=-1)
    unrecovered = [turn for turn in failed if turn.turn > last_ok]
    chosen = rewrite[0] if rewrite else (unrecovered[-1] if unrecovered else None)
    if chosen is None:
        return None
    status = f"upstream {chosen.upstream_status}" if chosen.upstream_status is not None else "upstream"
    message = f"{status}: {_message(chosen)} (call {chosen.turn + 1} of {len(ordered)}; {len(failed)} failed)"
    return ErrorInfo(type=_kind(chosen, mode), stage="llm", message=message)


def _failed(turn: Turn) -> bool:
    if turn.upstream_status is not None and turn.upstream_status >= 400:
        return True
    return turn.error is not None and turn.error not in CUT_ERRORS


def _message(turn: Turn) -> str:
    detail = turn.upstream_error or {}
    message = detail.get("message") if isinstance(detail, dict) else None
    text = message if isinstance(message, str) and message else (turn.error or "failed")
    return " ".join(text.split())[:_MAX_MESSAGE]


def _kind(turn: Turn, mode: Mode) -> str:
    status = turn.upstream_status
    if status is not None and 400 <= status < 500 and status not in _UPSTREAM_SIDE:
        text = _message(turn)
        if mode is Mode.TRANSPARENT_PROXY and any(field in text for field in _ADDED):
            return "LlmRewriteRefused"
        return "LlmRequestRefused"
    return "LlmUpstreamError"
