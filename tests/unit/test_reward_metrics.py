"""Named metrics as Harbor reads them (`reward.json` first, then `reward.txt`), pinned on the pure rule
(`workspace.verify.score`) and once end to end: a rollout on the local backend whose verify writes a
multi-metric `reward.json` carries every metric in `rewards` and the scalar the rule picks in `reward`.

Harbor 0.26.0's verifier (`harbor/verifier/verifier.py`) is the reference: `reward.json` wins when it exists
(a bad one is an error there, a noted 0 here, never `reward.txt` instead); its values must be numbers
(`isinstance(value, (int, float))`, so `true`/`false` pass and become 1/0) and finite; an object is required
(`VerifierResult.rewards` is a dict); `reward.txt` is one finite float, the metric `reward`.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coding_agent_env.models import CommandResult, RolloutRequest, RolloutResult, RolloutStatus, WorkspaceReport
from coding_agent_env.rollout import run_rollout
from coding_agent_env.settings import Settings
from coding_agent_env.workspace.verify.score import (
    MAX_REWARD_JSON_CHARS,
    Unreadable,
    parse_reward_json,
    score,
    select_reward,
)
from tests.unit.test_total_parsers import HOSTILE_TEXT, TOTAL


def cmd(ok: bool) -> CommandResult:
    return CommandResult(cmd="c", exit_code=0 if ok else 1)


def harbor(reward_json: str | Unreadable | None = None, reward_text: str | Unreadable | None = None,
           metric: str | None = None, passed: bool = True):  # noqa: ANN201 - a Score
    return score([cmd(passed)], reward_text, reward_json=reward_json, file_required=True, metric=metric)


# -- Harbor's rule: which file wins -----------------------------------------------------------------------------


def test_a_fully_passing_multi_metric_reward_json_scores_1() -> None:
    """The bug this fixes: `{"correctness": 1, "performance": 1}` scored 0 (reward.txt won, the object was
    ignored)."""
    scored = harbor('{"correctness": 1, "performance": 1}')
    assert scored.reward == 1.0
    assert scored.rewards == {"correctness": 1.0, "performance": 1.0}


def test_reward_json_wins_over_reward_txt() -> None:
    scored = harbor('{"correctness": 1, "performance": 1}', reward_text="0")
    assert scored.reward == 1.0 and scored.rewards == {"correctness": 1.0, "performance": 1.0}
    assert scored.note is not None and "reward.txt not read" in scored.note


def test_a_bad_reward_json_scores_0_and_reward_txt_is_not_used_instead() -> None:
    scored = harbor('{"reward": NaN}', reward_text="1")
    assert (scored.reward, scored.rewards) == (0.0, None)
    assert scored.note is not None and scored.note.startswith("reward.json ignored: metric 'reward' is not finite")


def test_reward_txt_alone_is_the_reward_with_no_named_metrics() -> None:
    assert (harbor(reward_text=" 0.25\n").reward, harbor(reward_text="0.25").rewards) == (0.25, None)
    bad = harbor(reward_text="2")
    assert bad.reward == 0.0 and bad.note == "reward file ignored: out of [0, 1]: '2'"


def test_neither_file_scores_0_however_verify_exited() -> None:
    scored = harbor(passed=True)
    assert (scored.reward, scored.rewards) == (0.0, None)
    assert scored.note is not None and "no reward file" in scored.note


def test_an_unreadable_reward_json_scores_0_with_why() -> None:
    scored = harbor(Unreadable("longer than 4096 bytes"), reward_text="1")
    assert (scored.reward, scored.note) == (0.0, "reward.json ignored: longer than 4096 bytes")
    assert harbor(reward_text=Unreadable("not a regular file")).note == "reward file ignored: not a regular file"


# -- Harbor's rule: the scalar -----------------------------------------------------------------------------------


def test_the_reward_metric_is_the_scalar_when_present() -> None:
    scored = harbor('{"reward": 0.25, "correctness": 1, "style": 0}')
    assert scored.reward == 0.25 and scored.note is None
    assert scored.rewards == {"reward": 0.25, "correctness": 1.0, "style": 0.0}


def test_a_single_metric_is_the_scalar() -> None:
    assert harbor('{"accuracy": 0.75}').reward == 0.75


def test_several_metrics_without_reward_average() -> None:
    scored = harbor('{"a": 1, "b": 0, "c": 0.5}')
    assert scored.reward == 0.5 and scored.rewards == {"a": 1.0, "b": 0.0, "c": 0.5}
    assert scored.note is not None and "mean of the 3 metrics" in scored.note


def test_reward_metric_names_the_scalar() -> None:
    scored = harbor('{"reward": 0.1, "correctness": 0.75}', metric="correctness")
    assert scored.reward == 0.75 and scored.rewards == {"reward": 0.1, "correctness": 0.75}
    assert harbor('{"reward": 0.1, "correctness": 0.75}', metric="reward").reward == 0.1


def test_a_named_metric_that_is_missing_scores_0_naming_it_and_those_present() -> None:
    scored = harbor('{"correctness": 1, "performance": 1}', metric="accuracy")
    assert scored.reward == 0.0 and scored.rewards == {"correctness": 1.0, "performance": 1.0}
    assert scored.note == ("reward_metric 'accuracy' is not among the metrics verify wrote ('correctness', "
                           "'performance'): scored 0")
    many = select_reward({f"m{i}": 1.0 for i in range(25)}, "x")
    assert many.note is not None and "'m9' and 15 more" in many.note and "'m10'" not in many.note


def test_a_named_metric_with_only_reward_txt() -> None:
    """reward.txt is Harbor's single metric `reward`: a reward_metric naming another is missing."""
    assert harbor(reward_text="1", metric="reward").reward == 1.0
    missing = harbor(reward_text="1", metric="correctness")
    assert missing.reward == 0.0 and missing.note is not None and "'correctness'" in missing.note


def test_an_empty_object_scores_0() -> None:
    scored = harbor("{}")
    assert (scored.reward, scored.rewards) == (0.0, {})
    assert scored.note == "reward.json holds no metrics: scored 0"


def test_values_outside_0_1_score_0_like_reward_txt_and_are_kept() -> None:
    over = harbor('{"reward": 2}')
    assert over.reward == 0.0 and over.rewards == {"reward": 2.0}
    assert over.note is not None and "'reward' is 2.0, out of [0, 1]: scored 0" in over.note
    assert harbor('{"a": 1, "b": -0.5}').reward == 0.0  # the mean takes every metric: each must be in range
    assert harbor('{"only": 1e20}').reward == 0.0
    # A metric the scalar is not taken from may be anything finite.
    aside = harbor('{"reward": 0.5, "steps": 12, "delta": -3}')
    assert aside.reward == 0.5 and aside.rewards == {"reward": 0.5, "steps": 12.0, "delta": -3.0}
    assert harbor('{"reward": 0.5, "steps": 12}', metric="steps").reward == 0.0


# -- Harbor's rule: hostile files ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"reward": NaN}', "metric 'reward' is not finite (nan)"),
        ('{"reward": Infinity}', "metric 'reward' is not finite (inf)"),
        ('{"a": 1, "b": -Infinity}', "metric 'b' is not finite (-inf)"),
        ('{"reward": 1e999}', "metric 'reward' is not finite (inf)"),
        ('{"reward": 1' + "0" * 400 + "}", "metric 'reward' is not finite (an integer too large for a float)"),
        ('{"reward": {"value": 1}}', "metric 'reward' is not a number (it is an object)"),
        ('{"reward": [1]}', "metric 'reward' is not a number (it is a list)"),
        ('{"reward": "1"}', "metric 'reward' is not a number (it is a string)"),
        ('{"reward": "NaN"}', "metric 'reward' is not a number (it is a string)"),
        ('{"reward": null}', "metric 'reward' is not a number (it is null)"),
        ("0.5", "not a JSON object of named metrics (it is a number)"),
        ("[1, 0]", "not a JSON object of named metrics (it is a list)"),
        ("null", "not a JSON object of named metrics (it is null)"),
        ('"1"', "not a JSON object of named metrics (it is a string)"),
        ("true", "not a JSON object of named metrics (it is a boolean)"),
        ("", "empty"),
        (" \n", "empty"),
        ("{reward: 1}", "not JSON"),
        ('{"reward": 1', "not JSON"),
        ('{"\\ud800": 1}', "metric name '?' is not valid Unicode text"),
        ("[" * 17 + "]" * 17, "nested deeper than 16 levels"),
        ('{"a":' * 800, "nested deeper than 16 levels"),
        ("[" * 5000, "longer than 4096 characters"),
        ('{"reward": 1, "pad": "' + "x" * 10_000_000 + '"}', "longer than 4096 characters"),  # 10 MB
    ],
    ids=lambda value: value[:40] if isinstance(value, str) else value,
)
def test_a_hostile_reward_json_scores_0_with_the_precise_reason(text: str, reason: str) -> None:
    with pytest.raises(ValueError) as raised:
        parse_reward_json(text)
    assert str(raised.value) == reason
    scored = harbor(text, reward_text="1")
    assert (scored.reward, scored.rewards, scored.note) == (0.0, None, f"reward.json ignored: {reason}")


def test_booleans_count_as_1_and_0_as_harbor_takes_them() -> None:
    """Harbor's check is `isinstance(value, (int, float))` (a bool is an int) and its pydantic model makes
    `true` 1.0: a verifier writing `{"passed": true}` passes there, so here too."""
    scored = harbor('{"passed": true, "lint": false}')
    assert scored.rewards == {"passed": 1.0, "lint": 0.0} and scored.reward == 0.5
    assert all(type(value) is float for value in scored.rewards.values())


def test_odd_but_valid_files() -> None:
    assert parse_reward_json('{"a": 1, "a": 0}') == {"a": 0.0}  # the last duplicate, as json.loads (and Harbor)
    assert parse_reward_json('{"reward": 1' + "0" * 300 + "}") == {"reward": 1e300}  # finite: kept
    assert harbor('{"reward": 1' + "0" * 300 + "}").reward == 0.0
    with pytest.raises(ValueError, match="not JSON"):  # a byte-order mark: json.loads refuses it, as in Harbor
        parse_reward_json('\ufeff{"reward": 1}')
    assert parse_reward_json('{"": 0.5}') == {"": 0.5}
    at_bound = '{"reward": 1' + " " * (MAX_REWARD_JSON_CHARS - 13) + "}"
    assert len(at_bound) == MAX_REWARD_JSON_CHARS and parse_reward_json(at_bound) == {"reward": 1.0}
    with pytest.raises(ValueError, match="longer than"):
        parse_reward_json(at_bound + " ")


@TOTAL
@given(HOSTILE_TEXT, st.one_of(st.none(), st.sampled_from(["reward", "a", "type"])),
       st.one_of(st.none(), st.text(max_size=8)))
def test_harbor_scoring_is_total(text: str, metric: str | None, reward_text: str | None) -> None:
    try:
        metrics = parse_reward_json(text)
    except ValueError as exc:
        assert str(exc)
    else:
        assert all(type(value) is float and math.isfinite(value) for value in metrics.values())
    scored = harbor(text, reward_text=reward_text, metric=metric)
    assert scored.reward is not None and math.isfinite(scored.reward) and 0.0 <= scored.reward <= 1.0
    assert scored.rewards is None or all(math.isfinite(value) for value in scored.rewards.values())
    if scored.reward == 0.0 and scored.rewards is None:
        assert scored.note
    WorkspaceReport(sandbox="local", reward=scored.reward, rewards=scored.rewards)  # always a valid result


# -- the plain rule: unchanged ---------------------------------------------------------------------------------


def plain(reward_json: str | None = None, reward_text: str | None = None, oks: tuple[bool, ...] = (True, False),
          metric: str | None = None):  # noqa: ANN201 - a Score
    return score([cmd(ok) for ok in oks], reward_text, reward_json=reward_json, metric=metric)


def test_plain_reward_txt_still_wins_and_a_multi_metric_json_is_still_ignored() -> None:
    assert plain('{"reward": 1}', reward_text="0.25").reward == 0.25
    ignored = plain('{"correctness": 1, "performance": 1}')
    assert (ignored.reward, ignored.rewards) == (0.5, None)  # the fraction of verify commands that passed
    assert ignored.note is not None and ignored.note.startswith("reward.json ignored: an object without")


def test_plain_keeps_the_metrics_of_the_json_its_reward_came_from() -> None:
    scored = plain('{"reward": 0.75, "speed": 3}')
    assert (scored.reward, scored.rewards, scored.note) == (0.75, {"reward": 0.75, "speed": 3.0}, None)
    assert plain('{"accuracy": 1, "log": "text"}').rewards is None  # today's rule takes it; Harbor's would not
    assert (plain("0.25").reward, plain("0.25").rewards) == (0.25, None)  # a bare number: no named metrics
    out = plain('{"reward": 2}')
    assert (out.reward, out.rewards) == (0.5, None) and out.note == "reward file ignored: out of [0, 1]: '2.0'"


def test_plain_ignores_reward_metric_and_says_so() -> None:
    scored = plain('{"reward": 0.75, "correctness": 0}', metric="correctness")
    assert scored.reward == 0.75
    assert scored.note is not None and "reward_metric ignored" in scored.note
    assert plain(oks=()).reward is None and plain(oks=()).rewards is None


# -- the result model ------------------------------------------------------------------------------------------


def test_results_carry_rewards_and_refuse_non_finite_ones() -> None:
    result = RolloutResult(rollout_id="r", agent="oracle", sandbox="local", status=RolloutStatus.COMPLETED,
                           reward=1.0, rewards={"correctness": 1.0, "performance": 1.0})
    assert '"rewards":{"correctness":1.0,"performance":1.0}' in result.model_dump_json()
    assert RolloutResult.model_validate_json(result.model_dump_json()).rewards == result.rewards
    with pytest.raises(ValueError, match="finite"):
        WorkspaceReport(sandbox="local", reward=1.0, rewards={"a": math.nan})
    assert WorkspaceReport(sandbox="local").rewards is None


def test_a_null_reward_carries_no_metrics() -> None:
    """An invalid episode (infra error, cancelled) has reward null whatever verify wrote: rewards too."""
    voided = RolloutResult(rollout_id="r", agent="oracle", sandbox="local", status=RolloutStatus.INFRA_ERROR,
                           reward=None, rewards={"correctness": 1.0})
    assert voided.rewards is None


# -- end to end ------------------------------------------------------------------------------------------------

WRITE_METRICS = (
    "python3 -c \"import json, os; d = os.path.dirname(os.environ['REWARD_FILE']); "
    "ok = open('answer.txt').read().strip() == '42'; "
    "json.dump({'correctness': int(ok), 'performance': 1}, open(os.path.join(d, 'reward.json'), 'w')); "
    "open(os.path.join(d, 'reward.txt'), 'w').write('0')\""
)
"""A verifier writing Harbor's multi-metric reward.json, and a reward.txt of 0 beside it that must not count."""


@pytest.mark.usefixtures("assert_no_leftovers")
@pytest.mark.parametrize(
    ("answer", "metric", "reward", "rewards"),
    [("42", None, 1.0, {"correctness": 1.0, "performance": 1.0}),
     ("41", None, 0.5, {"correctness": 0.0, "performance": 1.0}),
     ("41", "correctness", 0.0, {"correctness": 0.0, "performance": 1.0})],
    ids=["right", "wrong-mean", "wrong-named"],
)
async def test_a_rollout_reports_every_metric_of_reward_json(
    settings: Settings, answer: str, metric: str | None, reward: float, rewards: dict[str, float]
) -> None:
    request = RolloutRequest(
        instruction="Write 42 to answer.txt.", agent="oracle", solution=[f"echo {answer} > answer.txt"],
        verify=["test -f answer.txt", WRITE_METRICS], reward_file_required=True, reward_metric=metric,
        command_timeout_s=30,
    )
    result = await run_rollout(request, settings=settings)
    assert result.status is RolloutStatus.COMPLETED, result.error
    assert result.reward == reward, (result.reward_note, result.verify_results)
    assert result.reward_note is not None and "reward.txt not read" in result.reward_note
    assert result.rewards == rewards, result.reward_note
    assert '"rewards":' in result.model_dump_json()


@pytest.mark.usefixtures("assert_no_leftovers")
async def test_a_10_mb_reward_json_is_refused_as_too_long_not_cut_into_bad_json(settings: Settings) -> None:
    write = ("python3 -c \"import os; d = os.path.dirname(os.environ['REWARD_FILE']); "
             "open(os.path.join(d, 'reward.json'), 'w').write('{\\\"reward\\\": 1, \\\"pad\\\": \\\"' + "
             "'x' * 10_000_000 + '\\\"}')\"")
    request = RolloutRequest(instruction="x", agent="oracle", solution=["true"], verify=[write],
                             reward_file_required=True, command_timeout_s=30)
    result = await run_rollout(request, settings=settings)
    assert result.status is RolloutStatus.COMPLETED, result.error
    assert (result.reward, result.rewards) == (0.0, None), result.verify_results
    assert result.reward_note == f"reward.json ignored: longer than {MAX_REWARD_JSON_CHARS} bytes"
