"""`build_terminal_tool_call` and `arguments_to_call`: the accepted shapes, prose refused, and (hypothesis)
total and bounded on any input, deep nesting included."""

from __future__ import annotations

import json
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from coding_agent_env.agents.terminus.parse import (
    MAX_DEPTH,
    MAX_TEXT_CHARS,
    ParseFailure,
    TerminalCall,
    arguments_to_call,
    build_terminal_tool_call,
)

CMD = TerminalCall(command="ls -la")


def test_accepted_shapes() -> None:
    shapes = [
        '{"name": "terminal", "arguments": {"command": "ls -la"}}',
        '{"name": "terminal", "arguments": "{\\"command\\": \\"ls -la\\"}"}',
        '{"function": {"name": "terminal", "arguments": {"command": "ls -la"}}}',
        'Sure.\n<tool_call>{"name": "terminal", "arguments": {"command": "ls -la"}}</tool_call>',
        'Here:\n```json\n{"command": "ls -la"}\n```\n',
        "I will run terminal(command='ls -la') now",
        'terminal(command="""ls -la""")',
        'prose first {"command": "ls -la"} prose after',
    ]
    for text in shapes:
        assert build_terminal_tool_call(text) == CMD, text
    assert build_terminal_tool_call("terminal(final_answer='done')") == TerminalCall(final_answer="done")
    assert build_terminal_tool_call('{"final_answer": "ok"}') == TerminalCall(final_answer="ok")


def test_prose_is_not_a_command_unless_loose() -> None:
    prose = "I think we should run ls -la and then look around.\n```bash\nrm -rf /\n```"
    assert isinstance(build_terminal_tool_call(prose), ParseFailure)
    assert build_terminal_tool_call(prose, loose=True) == TerminalCall(command="rm -rf /\n")
    assert build_terminal_tool_call("just words", loose=True) == TerminalCall(command="just words")


def test_other_tools_and_bad_arguments_are_failures() -> None:
    for text in ['{"name": "python", "arguments": {"command": "x"}}', '{"command": 5}', '{"command": ""}',
                 "terminal(command=os.system('x'))", "terminal(command='unterminated"]:
        assert isinstance(build_terminal_tool_call(text), ParseFailure), text
    assert isinstance(arguments_to_call(json.dumps(json.dumps(json.dumps(json.dumps(json.dumps({"command": "x"})))))), ParseFailure)
    assert arguments_to_call(json.dumps(json.dumps({"command": "x"}))) == TerminalCall(command="x")


def test_deep_nesting_and_huge_text_are_bounded_failures() -> None:
    for text in ["[" * 100_000, "{" * 100_000 + "}" * 100_000, '{"a":' * 50_000 + "1" + "}" * 50_000,
                 "(" * 100_000, "x" * (MAX_TEXT_CHARS + 1)]:
        started = time.monotonic()
        assert isinstance(build_terminal_tool_call(text), ParseFailure)
        assert time.monotonic() - started < 2.0
    nested = '{"command": "x", "pad": ' + "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5) + "}"
    assert isinstance(arguments_to_call(nested), ParseFailure)
    assert isinstance(arguments_to_call({"command": ["x"]}), ParseFailure)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=2000), st.booleans())
def test_never_raises_on_any_text(text: str, loose: bool) -> None:
    result = build_terminal_tool_call(text, loose=loose)
    assert isinstance(result, (TerminalCall, ParseFailure))
    if isinstance(result, TerminalCall):
        assert (result.command is None) != (result.final_answer is None)


@settings(max_examples=300, deadline=None)
@given(json_values, st.sampled_from(["", "<tool_call>", "```json\n", "terminal(command="]))
def test_never_raises_on_json_shapes(value: object, prefix: str) -> None:
    text = prefix + json.dumps(value)
    assert isinstance(build_terminal_tool_call(text), (TerminalCall, ParseFailure))
    assert isinstance(arguments_to_call(value), (TerminalCall, ParseFailure))
    assert isinstance(arguments_to_call(json.dumps(value)), (TerminalCall, ParseFailure))


@settings(max_examples=50, deadline=None)
@given(st.integers(min_value=MAX_DEPTH + 1, max_value=200_000), st.sampled_from(["[", "{", "(", '{"a":']))
def test_deep_nesting_never_recurses(depth: int, opener: str) -> None:
    assert isinstance(build_terminal_tool_call(opener * depth), ParseFailure)
    assert isinstance(arguments_to_call(opener * depth), ParseFailure)
