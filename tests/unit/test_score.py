"""workspace.verify.score is pure: these pin its rule."""

from __future__ import annotations

import math

import pytest

from hypothesis import given
from hypothesis import strategies as st

from coding_agent_env.models import CommandResult
from coding_agent_env.workspace.verify.score import parse_reward_file, reward_from_json, score


def cmd(ok: bool) -> CommandResult:
    return CommandResult(cmd="c", exit_code=0 if ok else 1)


def test_reward_file_wins_over_pass_rate() -> None:
    assert score([cmd(False)], " 0.75\n").reward == 0.75


def test_pass_rate_without_reward_file() -> None:
    assert score([cmd(True), cmd(False), cmd(True), cmd(True)], None).reward == 0.75


def test_timed_out_command_does_not_pass() -> None:
    assert score([CommandResult(cmd="c", exit_code=0, timed_out=True)], None).reward == 0.0


def test_nothing_to_score_is_null() -> None:
    result = score([], None)
    assert result.reward is None and result.note


def test_bad_reward_file_is_reported_and_ignored() -> None:
    result = score([cmd(True)], "NaN")
    assert result.reward == 1.0 and result.note is not None and "not finite" in result.note
    assert score([], "2").reward is None


@given(st.text(max_size=200))
def test_reward_file_parsing_is_total(text: str) -> None:
    try:
        value = parse_reward_file(text)
    except ValueError:
        return
    assert math.isfinite(value) and 0.0 <= value <= 1.0


@given(st.lists(st.booleans(), max_size=50), st.one_of(st.none(), st.text(max_size=20)))
def test_score_is_in_range_or_null(oks: list[bool], text: str | None) -> None:
    reward = score([cmd(ok) for ok in oks], text).reward
    assert reward is None or 0.0 <= reward <= 1.0


def test_reward_from_json_harbor_shapes() -> None:

    assert parse_reward_file(reward_from_json('{"reward": 0.5}')) == 0.5
    assert parse_reward_file(reward_from_json('{"accuracy": 1}')) == 1.0
    assert parse_reward_file(reward_from_json("0.25")) == 0.25
    for bad in ('{"a": 1, "b": 0}', '{"reward": "1"}', "[1]", "nope", '{"reward": true}'):
        with pytest.raises(ValueError):
            reward_from_json(bad)
    with pytest.raises(ValueError):
        parse_reward_file(reward_from_json('{"reward": 2}'))
