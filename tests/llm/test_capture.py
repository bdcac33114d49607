"""SSE parsing and turn assembly are total and independent of how bytes are split."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from coding_agent_env.llm.capture import TurnAssembler
from coding_agent_env.llm.sse import SseParser

EVENTS = [{"choices": [{"index": 0, "delta": {"content": f"t{i} "}}]} for i in range(5)]
STREAM = b"".join(f"data: {json.dumps(e)}\r\n\r\n".encode() for e in EVENTS) + b": comment\n\ndata: [DONE]\n\n"


@given(st.lists(st.integers(min_value=1, max_value=len(STREAM)), max_size=20))
def test_sse_parser_is_split_independent(cuts: list[int]) -> None:
    parser = SseParser(max_event_bytes=10_000)
    edges = sorted(set(cuts))
    pieces = [STREAM[a:b] for a, b in zip([0, *edges], [*edges, len(STREAM)])]
    out = [data for piece in pieces for data in parser.feed(piece)]
    assert out == [json.dumps(e) for e in EVENTS] + ["[DONE]"]


def test_sse_parser_drops_oversized_events() -> None:
    parser = SseParser(max_event_bytes=100)
    assert parser.feed(b"data: " + b"x" * 500 + b"\n\ndata: ok\n\n") == ["ok"]
    assert parser.dropped == 1


@given(st.recursive(st.none() | st.integers() | st.text(max_size=5), lambda c: st.lists(c, max_size=3) | st.dictionaries(st.sampled_from(["choices", "delta", "message", "usage", "tool_calls", "index", "logprobs", "content", "function"]), c, max_size=3), max_leaves=20))
def test_assembler_is_total(junk: object) -> None:
    assembler = TurnAssembler()
    assembler.add_chunk(junk)
    assembler.add_response(junk)
    assembler.message()
