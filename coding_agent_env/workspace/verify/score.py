"""Pure scoring: verify outcomes (and the reward file's text, if any) -> reward.

Rule: a reward file holding one finite number in [0, 1] wins; otherwise the fraction of verify commands that
passed; with neither, no reward (null). A reward file that is present but unusable is ignored and the note
says why. Nothing here looks at text the agent could have written other than through verify's own file.

The parsers are total: whatever the text (any length, nesting, number size, lone surrogates), they return a
reward or raise `ValueError` with the reason, nothing else. A reward file is written by verify, which may run
the agent's code: an exception of any other kind would turn a score into an infra error, an escape a policy
can learn.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from coding_agent_env import jsonsafe
from coding_agent_env.models import CommandResult

__all__ = ["Score", "parse_reward_file", "reward_from_json", "score"]

MAX_REWARD_FILE_CHARS = 64
"""A reward file longer than this is not a number."""
MAX_REWARD_JSON_CHARS = 4096
"""A `reward.json` longer than this is not a reward (the reader takes no more bytes than that anyway)."""
MAX_REWARD_JSON_DEPTH = 16
"""Deepest bracket nesting of a `reward.json` parsed: json recurses once per level, without a bound of its own."""


@dataclass(frozen=True)
class Score:
    reward: float | None
    note: str | None = None


def parse_reward_file(text: str) -> float:
    """The reward a file's text states; ValueError with the reason when it states none (and only ValueError)."""
    if not isinstance(text, str):
        raise ValueError("not text")
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
    number, `{"reward": x}`, or an object with exactly one numeric value. ValueError with the reason otherwise,
    and only ValueError (see the module docstring)."""
    data = jsonsafe.loads(text, max_chars=MAX_REWARD_JSON_CHARS, max_depth=MAX_REWARD_JSON_DEPTH)
    return _reward_text(data)


def _reward_text(data: object) -> str:
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
    try:
        return repr(float(data))
    except OverflowError:  # an integer too large for a float: certainly not in [0, 1]
        raise ValueError("the reward is out of [0, 1] (an integer too large)") from None


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
