"""Pure scoring: verify outcomes (and the reward file's text, if any) -> reward.

Rule: a reward file holding one finite number in [0, 1] wins; otherwise the fraction of verify commands that
passed; with neither, no reward (null). A reward file that is present but unusable is ignored and the note
says why. Nothing here looks at text the agent could have written other than through verify's own file.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

from coding_agent_env.models import CommandResult

__all__ = ["Score", "parse_reward_file", "reward_from_json", "score"]

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


def reward_from_json(text: str) -> str:
    """The reward a Harbor `reward.json` states, as reward-file text (`parse_reward_file` then checks it): a bare
    number, `{"reward": x}`, or an object with exactly one numeric value. ValueError with the reason otherwise."""
    try:
        data = json.loads(text)
    except ValueError:
        raise ValueError("not JSON") from None
    if isinstance(data, dict):
        if "reward" in data:
            data = data["reward"]
        else:
            numbers = [value for value in data.values()
                       if isinstance(value, (int, float)) and not isinstance(value, bool)]
            if len(numbers) != 1:
                raise ValueError("an object without a 'reward' key or a single numeric value")
            data = numbers[0]
    if isinstance(data, bool) or not isinstance(data, (int, float)):
        raise ValueError("the reward is not a number")
    return repr(float(data))


def score(verify_results: Sequence[CommandResult], reward_text: str | None, *, file_required: bool = False) -> Score:
    """The reward of a verify outcome; with `file_required`, a missing or unusable reward file scores 0 (noted)."""
    note = None
    if reward_text is not None:
        try:
            return Score(parse_reward_file(reward_text))
        except ValueError as exc:
            note = f"reward file ignored: {exc}"
    if file_required:
        return Score(0.0, note or "verify wrote no reward file (the task requires one)")
    if verify_results:
        passed = sum(1 for result in verify_results if result.ok)
        return Score(passed / len(verify_results), note)
    return Score(None, note or "no verify commands and no reward file")
