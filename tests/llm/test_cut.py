"""A call the relay cut before its answer was whole (the agent's phase ended, the rollout was cancelled, the agent
hung up) is recorded as cut: outside the rollout graph, not classified, never trainable."""

from __future__ import annotations

from coding_agent_env.llm.graph import build_graph
from coding_agent_env.llm.trace import annotate
from coding_agent_env.models import Turn, TurnMessage

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
SYSTEM = {"role": "system", "content": "you are an agent"}


def test_a_call_cut_at_the_deadline_is_cut_not_a_compaction() -> None:
    first = Turn(turn=0, request_messages=[SYSTEM, {"role": "user", "content": "go"}], request_tools=TOOLS,
                 upstream_status=200, message=TurnMessage(content="ok"), prompt_token_ids=[1, 2, 3],
                 completion_token_ids=[4], completion_tokens=["ok"], per_token_logps=[-0.1])
    cut = Turn(turn=1, request_messages_reused=2, request_messages=[{"role": "assistant", "content": "ok"},
               {"role": "user", "content": "more"}], request_tools_reused=True, error="lease closed")
    assert build_graph([first, cut]).nodes[1].purpose == "compaction"  # what an unanswered call looks like
    turns, graph = annotate([first, cut], "r")
    assert [t.turn for t in turns] == [0, 1] and len(graph.nodes) == 1
    assert turns[0].purpose == "main" and turns[0].trainable
    assert turns[1].purpose is None and not turns[1].trainable and turns[1].parent is None
    assert turns[1].note == "cut: lease closed before its answer was whole" and turns[1].node_id == "r:1"
