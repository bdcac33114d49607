"""Pure scoring: verify outcomes (and the reward file's text, if any) -> reward.

Rule: a reward file holding one finite number in [0, 1] wins; otherwise the fraction of verify commands that
passed; with neither, no reward (null). A reward file that is present but unusable is ignored and the note
says why. Nothing here looks at text the agent could have written other than through verify's own file.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from coding_agent_env.models import CommandResult

__all__ = ["Score", "parse_reward_file", "score"]

MAX_REWARD_FILE_CHARS = 64
"""A reward file longer than this is not a number."""


@dataclass(frozen=True)
class Score:
    reward: float | None
    note: str | None = None


def parse_reward_file(text: str) -> float:
    """The reward a file's text states; ValueError with the reason when it states none."""
    stripped = text.strip()
    if len(stripped) > MAX_REWARD_FILE_CHARS:
        raise ValueError(f"longer than {MAX_REWARD_FILE_CHARS} characters")
    try:
        value = float(stripped)
    except ValueError:
        raise ValueError(f"not a number: {stripped[:MAX_REWARD_FILE_CHARS]!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"not finite: {stripped!r}")
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"out of [0, 1]: {stripped!r}")
    return value


def score(verify_results: Sequence[CommandResult], reward_text: str | None) -> Score:
    note = None
    if reward_text is not None:
        try:
            return Score(parse_reward_file(reward_text))
        except ValueError as exc:
            note = f"reward file ignored: {exc}"
    if verify_results:
        passed = sum(1 for result in verify_results if result.ok)
        return Score(passed / len(verify_results), note)
    return Score(None, note or "no verify commands and no reward file")
