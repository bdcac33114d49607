"""Building a rollout's graph and training trace: a 200-call agent rollout, as the relay records it.

Each call's prompt is the previous prompt plus the previous completion plus a tool result (about 150 tokens a
call, so the last prompt holds about 30k tokens), with an auxiliary title call and a retry; the reference is
serialising the same turns to JSON, which every result pays anyway.

    .venv/bin/python bench/trace.py [N]
"""

from __future__ import annotations

import asyncio
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._common import measure, pct  # noqa: E402
from coding_agent_env.llm.trace import annotate, training_data  # noqa: E402
from coding_agent_env.models import Turn, TurnMessage  # noqa: E402

CALLS = 200
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


def rollout() -> list[Turn]:
    turns = [Turn(turn=0, request_messages=[{"role": "user", "content": "title"}], prompt_token_ids=[7] * 40,
                  completion_token_ids=[8] * 5, per_token_logps=[-0.1] * 5, message=TurnMessage(content="t"))]
    prompt = list(range(1000, 1600))
    next_id = 5000
    for k in range(1, CALLS):
        completion = list(range(next_id, next_id + 60))
        next_id += 60
        turns.append(Turn(
            turn=k, request_messages_reused=max(0, 2 * k - 1) if k > 1 else 0,
            request_messages=[{"role": "assistant", "content": f"step {k}"}, {"role": "tool", "content": "out"}],
            request_tools=TOOLS if k == 1 else None, request_tools_reused=k > 1,
            prompt_token_ids=list(prompt), completion_token_ids=completion, per_token_logps=[-0.5] * 60,
            message=TurnMessage(content=f"step {k}"),
        ))
        if k != CALLS // 2:  # one retry: the call at CALLS // 2 is repeated with the same prompt
            prompt = prompt + completion + list(range(next_id, next_id + 90))
            next_id += 90
    return turns


async def main(n: int) -> None:
    turns = rollout()
    print(f"{len(turns)} calls, last prompt {len(turns[-1].prompt_token_ids or [])} tokens; n={n}")

    async def build() -> None:
        annotated, graph = annotate(turns, "r")
        training_data(graph, rollout_id="r", task_id="t", reward=1.0)

    async def serialise() -> None:
        for turn in turns:
            turn.model_dump_json()

    samples = await measure({"graph + training trace": build, "reference: turns to JSON": serialise}, n)
    ours, ref = pct(samples["graph + training trace"], 0.5), pct(samples["reference: turns to JSON"], 0.5)
    print(f"ratio p50 graph + trace / turns to JSON: {ours / ref:.2f}x")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 20))
