"""Every parse of sandbox output is total (INTEGRITY rules 6, 21, 31): fed arbitrary bytes, invalid UTF-8, lone
surrogates, deep nesting, huge numbers and NaN/Infinity literals, each parser returns, or raises only its
documented error. An exception of any other kind would turn a scored rollout into a traceback or an infra error:
an escape from a low reward that a policy can learn.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coding_agent_env.agents.codex import parse_codex_events
from coding_agent_env.agents.event_stream import AgentReport
from coding_agent_env.agents.gemini_cli import parse_gemini_events
from coding_agent_env.agents.mini_swe_agent import parse_mini_events
from coding_agent_env.agents.opencode import parse_opencode_events
from coding_agent_env.agents.pi import parse_pi_events
from coding_agent_env.agents.stream_json import parse_stream_json
from coding_agent_env.agents.terminus.agent import parse_terminus_events
from coding_agent_env.agents.terminus.core import ChatFailed
from coding_agent_env.agents.terminus.parse import (
    ParseFailure,
    TerminalCall,
    arguments_to_call,
    build_terminal_tool_call,
)
from coding_agent_env.agents.terminus.relay_chat import RelayChat
from coding_agent_env.workspace.verify.score import parse_reward_file, reward_from_json, score

# -- hostile input -----------------------------------------------------------------------------------------

DEEP = ["[" * 5000, "{" * 5000, '{"a":' * 5000, "[" * 5000 + "]" * 5000, '{"reward":' + "[" * 4000,
        '"' + "[" * 5000, "\\" + '"' + "{" * 3000]
"""Nesting beyond any recursion limit, balanced or not, and after a quote that fools a naive bracket count."""
LITERALS = ["NaN", "-Infinity", "Infinity", "1e999", "-1e999", "1" + "0" * 400, "9" * 4300, "1" * 5000,
            "-0", "0.5", "1", "true", "null", '"\\ud800"', '"\\udc80"', "\x00", "\ufeff0.5"]
"""Numbers too large for a float or for int(), NaN and infinities, and literals of other types."""


def _json_values() -> st.SearchStrategy[object]:
    leaves = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
                       st.text(alphabet=st.characters(exclude_categories=()), max_size=20))
    return st.recursive(leaves, lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(
            ["type", "message", "content", "item", "part", "usage", "tool_calls", "reward", "role", "text",
             "name", "input", "state", "tokens", "error", "result", "subtype", "is_error", "num_turns", "stats",
             "extra", "response", "function", "arguments", "command", "final_answer", "toolName", "args"]),
            inner, max_size=5)), max_leaves=20)


def _dumped(value: object) -> str:
    try:
        return json.dumps(value, ensure_ascii=False)
    except (ValueError, TypeError, RecursionError):
        return "{}"


HOSTILE_TEXT = st.one_of(
    st.binary(max_size=300).map(lambda data: data.decode("utf-8", "replace")),
    st.binary(max_size=300).map(lambda data: data.decode("utf-8", "surrogateescape")),
    st.text(alphabet=st.characters(exclude_categories=()), max_size=200),  # lone surrogates included
    st.sampled_from(DEEP + LITERALS),
    _json_values().map(_dumped),
    st.lists(st.one_of(st.sampled_from(DEEP + LITERALS), _json_values().map(_dumped)), max_size=5).map("\n".join),
)
"""Text as a sandbox could leave it: arbitrary bytes decoded either way, any code points, the literals above,
JSON of every shape, and lines of them."""

TOTAL = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- reward files --------------------------------------------------------------------------------------------


@TOTAL
@given(HOSTILE_TEXT)
def test_reward_json_raises_only_value_error(text: str) -> None:
    try:
        stated = reward_from_json(text)
    except ValueError:
        return
    try:
        value = parse_reward_file(stated)
    except ValueError:
        return
    assert math.isfinite(value) and 0.0 <= value <= 1.0


@TOTAL
@given(HOSTILE_TEXT)
def test_reward_file_raises_only_value_error(text: str) -> None:
    try:
        value = parse_reward_file(text)
    except ValueError:
        return
    assert math.isfinite(value) and 0.0 <= value <= 1.0


@pytest.mark.parametrize("text", DEEP + LITERALS + ["[" * 4096, '{"reward": ' + "1" + "0" * 300 + "}"])
def test_reward_json_edge_cases_are_reasons(text: str) -> None:
    """The cases that raised RecursionError and OverflowError before: each now a ValueError with a reason, and
    a required reward file then scores 0 with that reason noted."""
    try:
        stated = reward_from_json(text)
        parse_reward_file(stated)
    except ValueError as exc:
        assert str(exc)
        return
    assert text in ("0.5", "1", "-0", "\ufeff0.5")  # the only ones that state a reward


def test_deep_json_reward_is_a_noted_zero_where_a_file_is_required() -> None:
    with pytest.raises(ValueError, match="nested deeper"):
        reward_from_json("[" * 4096)
    scored = score([], None, file_required=True)
    assert scored.reward == 0.0 and scored.note


@TOTAL
@given(HOSTILE_TEXT, st.booleans())
def test_score_is_total(text: str, required: bool) -> None:
    scored = score([], text, file_required=required)
    assert scored.reward is None or (math.isfinite(scored.reward) and 0.0 <= scored.reward <= 1.0)
    if scored.reward is None or (required and scored.note):
        assert scored.note


# -- agents' event streams -------------------------------------------------------------------------------------

EVENT_PARSERS: list[Callable[[str], AgentReport]] = [
    parse_codex_events, parse_gemini_events, parse_mini_events, parse_opencode_events, parse_pi_events,
    parse_stream_json, parse_terminus_events,
]


def _report_is_sane(report: AgentReport) -> None:
    assert isinstance(report, AgentReport)
    assert report.events >= 0 and report.malformed >= 0 and report.steps >= 0 and report.tokens >= 0
    assert all(isinstance(name, str) and isinstance(detail, str) for name, detail in report.tool_calls)
    assert all(isinstance(text, str) for text in [*report.texts, *report.errors])


@pytest.mark.parametrize("parse", EVENT_PARSERS, ids=lambda parse: parse.__name__)
@TOTAL
@given(text=HOSTILE_TEXT)
def test_event_parsers_are_total(parse: Callable[[str], AgentReport], text: str) -> None:
    _report_is_sane(parse(text))


# Events whose fields have the wrong types where a parser iterates or looks inside them.
WRONG_TYPES = [
    {"type": "assistant", "message": {"content": 5}},
    {"type": "assistant", "message": {"content": [{"type": "tool_use", "name": ["x"], "input": "[" * 100}]}},
    {"type": "result", "usage": [], "num_turns": True, "is_error": True, "result": {"deep": [[[]]]}},
    {"message": {"role": "assistant", "tool_calls": 7, "content": None}},
    {"message": {"role": "assistant", "tool_calls": [{"function": 3}], "extra": {"response": 1}}},
    {"type": "item.completed", "item": {"type": "error", "message": 1e308}},
    {"type": "turn.failed", "error": "boom"},
    {"type": "turn.completed", "usage": {"input_tokens": 10**30, "output_tokens": -5}},
    {"type": "tool_use", "part": {"state": 3}},
    {"type": "step_finish", "part": {"tokens": {"total": 1.5}}},
    {"type": "result", "status": "error", "error": [1], "stats": None},
    {"type": "message_end", "message": {"role": "assistant", "content": 1, "usage": "x"}},
    {"type": "command", "command": {"a": None}},
]


@pytest.mark.parametrize("parse", EVENT_PARSERS, ids=lambda parse: parse.__name__)
def test_event_parsers_take_fields_of_the_wrong_type(parse: Callable[[str], AgentReport]) -> None:
    text = "\n".join(json.dumps(event) for event in WRONG_TYPES)
    report = parse(text)
    _report_is_sane(report)
    assert report.events == len(WRONG_TYPES)


@pytest.mark.parametrize("parse", EVENT_PARSERS, ids=lambda parse: parse.__name__)
def test_event_parsers_count_deep_lines_as_malformed(parse: Callable[[str], AgentReport]) -> None:
    report = parse("\n".join(['{"a":' * 5000, "{" + "[" * 5000, '{"type": "turn_start"}']))
    assert report.malformed == 2 and report.events == 1


# -- Terminus: model output --------------------------------------------------------------------------------------


@TOTAL
@given(HOSTILE_TEXT, st.booleans())
def test_terminal_tool_call_parse_is_total(text: str, loose: bool) -> None:
    assert isinstance(build_terminal_tool_call(text, loose=loose), (TerminalCall, ParseFailure))
    assert isinstance(arguments_to_call(text), (TerminalCall, ParseFailure))


@pytest.mark.parametrize("text", [*DEEP, '"{"name":' + "[" * 990 + "]" * 990 + "}",
                                  '"{"name":"terminal","arguments":{"command":' + "[" * 990 + "]" * 990 + "}}"])
def test_terminal_tool_call_parse_survives_deep_nesting(text: str) -> None:
    assert isinstance(build_terminal_tool_call(text), ParseFailure)


async def test_a_conversation_too_deep_to_encode_is_a_failed_call_not_an_exception() -> None:
    """The model's tool calls are kept verbatim in the conversation: one nested deeper than the JSON encoder goes
    ends Terminus's loop as a failed LLM call (the agent's outcome), before anything is sent."""
    deep: object = "x"
    for _ in range(5000):
        deep = {"a": deep}
    body = {"messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": deep}}]}]}
    async with RelayChat("http://127.0.0.1:9/v1", "tok", timeout_s=5) as chat:
        answer, large = await chat.complete(body)
    assert isinstance(answer, ChatFailed) and "cannot be encoded" in answer.error and not large
