"""Pure scoring: verify outcomes and the reward files verify wrote, if any -> reward (and named metrics).

Two rules, chosen by the task's `reward_file_required`:

Harbor's (`reward_file_required`, every Harbor task): `reward.json` first, then `reward.txt`, as Harbor's
verifier reads them; with neither, the reward is 0 (noted). Whichever file exists first decides: a
`reward.json` that exists but is unusable scores 0 with the reason, `reward.txt` beside it is not read.
- `reward.json` is a JSON object of named metrics, each a finite number (Harbor's validation: a string, null,
  a list or an object as a value is refused, and so are NaN, infinities and an integer too large for a float;
  `true`/`false` count as 1/0, as Harbor's pydantic model takes them). Every metric is kept (`rewards`). The
  scalar `reward` is the metric the task's `reward_metric` names (missing: 0, and the note names it and the
  metrics present), else the `reward` metric if present, else the single metric if there is only one, else
  the mean of all the metrics. An empty object scores 0 (Harbor has no reward then either).
- `reward.txt` holds one finite number: the reward (Harbor reads it as the single metric `reward`; a
  `reward_metric` naming another metric is then missing, as above). `rewards` stays null.
- A reward outside [0, 1] scores 0 with a note, as a `reward.txt` outside [0, 1] always has: for `reward.json`,
  when a metric the scalar is taken from (the named one, `reward`, the single one, or any of them for the
  mean) is outside [0, 1]; `rewards` still holds every metric as written.

The plain rule (every other task), unchanged: `reward.txt` if verify wrote it, else a `reward.json` stating
one number (a bare number, `{"reward": x}`, or an object with exactly one numeric value), counts when it is a
finite number in [0, 1]; otherwise the fraction of verify commands that passed; with neither, no reward
(null). A reward file that is present but unusable is ignored and the note says why. When the reward came
from a `reward.json` object whose values all pass Harbor's validation, its metrics are kept in `rewards`.

Nothing here looks at text the agent could have written other than through verify's own files.

The parsers are total: whatever the text (any length, nesting, number size, lone surrogates), they return a
reward or raise `ValueError` with the reason, nothing else. A reward file is written by verify, which may run
the agent's code: an exception of any other kind would turn a score into an infra error, an escape a policy
can learn.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from coding_agent_env import jsonsafe
from coding_agent_env.models import CommandResult

__all__ = [
    "MAX_REWARD_JSON_CHARS",
    "RewardText",
    "Score",
    "Unreadable",
    "parse_reward_file",
    "parse_reward_json",
    "reward_from_json",
    "score",
    "select_reward",
]

MAX_REWARD_FILE_CHARS = 64
"""A reward file longer than this is not a number."""
MAX_REWARD_JSON_CHARS = 4096
"""A `reward.json` longer than this is not a reward (the reader takes no more bytes than that anyway)."""
MAX_REWARD_JSON_DEPTH = 16
"""Deepest bracket nesting of a `reward.json` parsed: json recurses once per level, without a bound of its own."""
_NAMES_SHOWN = 10
"""Metric names a note lists at most."""
_NAME_CHARS_SHOWN = 60
"""Characters of one metric name a note shows at most."""


@dataclass(frozen=True)
class Score:
    reward: float | None
    note: str | None = None
    rewards: dict[str, float] | None = None
    """Every named metric of the `reward.json` the reward was read from; None when none was."""


@dataclass(frozen=True)
class Unreadable:
    """A reward file that exists but could not be read (not a regular file, over the size bound): why."""

    reason: str


RewardText = str | Unreadable | None
"""A reward file as verify left it: its text, why it could not be read, or None when it does not exist."""


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
    """The reward a `reward.json` states under the plain rule, as reward-file text (`parse_reward_file` then
    checks it): a bare number, `{"reward": x}`, or an object with exactly one numeric value. ValueError with the
    reason otherwise, and only ValueError (see the module docstring)."""
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


def parse_reward_json(text: str) -> dict[str, float]:
    """The named metrics of a `reward.json`, validated as Harbor's verifier does (see the module docstring):
    a JSON object whose every value is a finite number (`true`/`false` as 1/0). ValueError with the reason
    otherwise, and only ValueError."""
    if isinstance(text, str) and not text.strip():
        raise ValueError("empty")
    data = jsonsafe.loads(text, max_chars=MAX_REWARD_JSON_CHARS, max_depth=MAX_REWARD_JSON_DEPTH)
    if not isinstance(data, dict):
        raise ValueError(f"not a JSON object of named metrics (it is {_kind(data)})")
    metrics: dict[str, float] = {}
    for name, value in data.items():
        if not _encodable(name):
            raise ValueError(f"metric name {_shown(name)} is not valid Unicode text")
        if not isinstance(value, (int, float)):  # bool is an int: Harbor takes it, as 1 or 0
            raise ValueError(f"metric {_shown(name)} is not a number (it is {_kind(value)})")
        try:
            number = float(value)
        except OverflowError:
            raise ValueError(f"metric {_shown(name)} is not finite (an integer too large for a float)") from None
        if not math.isfinite(number):
            raise ValueError(f"metric {_shown(name)} is not finite ({number!r})")
        metrics[name] = number
    return metrics


def select_reward(metrics: Mapping[str, float], metric: str | None = None) -> Score:
    """The scalar reward of named metrics (Harbor's rule, see the module docstring), with `metrics` kept as
    `rewards`: the one `metric` names, else `reward`, else the single one, else the mean; 0 with a note when
    the named one is missing, there is none, or one it is taken from is outside [0, 1]."""
    rewards = dict(metrics)
    if metric is not None:
        if metric not in rewards:
            return Score(0.0, f"reward_metric {_shown(metric)} is not among the metrics verify wrote "
                              f"({_listed(rewards)}): scored 0", rewards)
        used, how = [metric], None
    elif "reward" in rewards:
        used, how = ["reward"], None
    elif len(rewards) == 1:
        used, how = list(rewards), None
    elif not rewards:
        return Score(0.0, "reward.json holds no metrics: scored 0", rewards)
    else:
        used, how = list(rewards), f"reward: the mean of the {len(rewards)} metrics (no 'reward' metric)"
    for name in used:
        if not 0.0 <= rewards[name] <= 1.0:
            return Score(0.0, f"reward.json's metric {_shown(name)} is {rewards[name]!r}, out of [0, 1]: scored 0 "
                              "(as a reward.txt out of [0, 1] is); rewards keeps it", rewards)
    value = sum(rewards[name] for name in used) / len(used)
    return Score(min(1.0, max(0.0, value)), how, rewards)


def score(
    verify_results: Sequence[CommandResult],
    reward_text: RewardText,
    *,
    file_required: bool = False,
    reward_json: RewardText = None,
    metric: str | None = None,
) -> Score:
    """The reward of a verify outcome and the reward files verify left (`reward_text`: `reward.txt`;
    `reward_json`: `reward.json`). With `file_required`, Harbor's rule; otherwise the plain rule (see the
    module docstring). `metric` is the task's `reward_metric` (Harbor's rule only)."""
    if file_required:
        return _harbor(reward_text, reward_json, metric)
    scored = _plain(verify_results, reward_text, reward_json)
    if metric is not None:
        aside = "reward_metric ignored: it applies only where the task requires a reward file (reward_file_required)"
        return Score(scored.reward, aside if scored.note is None else f"{scored.note}; {aside}", scored.rewards)
    return scored


def _harbor(reward_text: RewardText, reward_json: RewardText, metric: str | None) -> Score:
    if reward_json is not None:
        if isinstance(reward_json, Unreadable):
            return Score(0.0, f"reward.json ignored: {reward_json.reason}")
        try:
            metrics = parse_reward_json(reward_json)
        except ValueError as exc:
            return Score(0.0, f"reward.json ignored: {exc}")
        scored = select_reward(metrics, metric)
        if reward_text is None:
            return scored
        aside = "reward.txt not read: reward.json counts (Harbor's rule)"
        return Score(scored.reward, aside if scored.note is None else f"{scored.note}; {aside}", scored.rewards)
    if reward_text is None:
        return Score(0.0, "verify wrote no reward file (the task requires reward.json or reward.txt)")
    if isinstance(reward_text, Unreadable):
        return Score(0.0, f"reward file ignored: {reward_text.reason}")
    try:
        value = parse_reward_file(reward_text)
    except ValueError as exc:
        return Score(0.0, f"reward file ignored: {exc}")
    if metric is not None and metric != "reward":
        return Score(0.0, f"reward_metric {_shown(metric)} is not among the metrics verify wrote (reward.txt "
                          "holds the one metric 'reward'): scored 0")
    return Score(value)


def _plain(verify_results: Sequence[CommandResult], reward_text: RewardText, reward_json: RewardText) -> Score:
    note = None
    rewards = None
    stated: RewardText = reward_text
    if reward_text is None and reward_json is not None:
        stated = reward_json
        if isinstance(reward_json, str):
            try:
                stated = reward_from_json(reward_json)
            except ValueError as exc:
                stated, note = None, f"reward.json ignored: {exc}"
            else:
                try:
                    rewards = parse_reward_json(reward_json)
                except ValueError:
                    rewards = None  # a bare number, or values Harbor would refuse: the reward alone
    if isinstance(stated, Unreadable):
        stated, note = None, f"reward file ignored: {stated.reason}"
    if stated is not None:
        try:
            return Score(parse_reward_file(stated), rewards=rewards)
        except ValueError as exc:
            note = f"reward file ignored: {exc}"
    if verify_results:
        passed = sum(1 for result in verify_results if result.ok)
        return Score(passed / len(verify_results), note)
    return Score(None, note or "no verify commands and no reward file")


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _encodable(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _shown(name: str) -> str:
    """A metric name as a note shows it: quoted, cut, lone surrogates replaced."""
    text = name if _encodable(name) else name.encode("utf-8", "replace").decode("utf-8")
    return repr(text if len(text) <= _NAME_CHARS_SHOWN else text[:_NAME_CHARS_SHOWN] + "...")


def _listed(metrics: Mapping[str, float]) -> str:
    if not metrics:
        return "none"
    names = [_shown(name) for name in list(metrics)[:_NAMES_SHOWN]]
    more = len(metrics) - len(names)
    return ", ".join(names) + (f" and {more} more" if more > 0 else "")
