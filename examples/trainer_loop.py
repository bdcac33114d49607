"""A trainer loop on the gate: the trainer answers every LLM call its rollouts make.

    python examples/trainer_loop.py            # runs 4 rollouts against a scripted policy, prints a summary

Each rollout is registered with the gate, which returns `base_url` and `token`. A real trainer passes them
to the environment server's `run_rollout` as `base_url=..., api_key=token, model=...` (see `start_rollout`);
the agent's calls then reach this process through the server's relay, one `next_request` at a time. Here a
tiny scripted "agent" (`simulated_agent`) stands in for the environment so the example runs anywhere.

Where a vLLM policy plugs in: replace `ScriptedPolicy.answer` with a call to your engine that returns a chat
completion (with `prompt_token_ids`, per-choice `token_ids` and `logprobs` if you want the relay to record
them in `RolloutResult.proxy_turns` without retokenisation), e.g. `VllmPolicy` below.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai

from coding_agent_env.gate import Gate, GateRequest

ROLLOUTS = 4


class ScriptedPolicy:
    """Turn 1: call the `bash` tool; afterwards: finish with a message."""

    async def answer(self, request: GateRequest) -> dict[str, Any]:
        if not any(m.get("role") == "tool" for m in request.messages if isinstance(m, dict)):
            call = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"cmd": "ls"})}}
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
            return {"choices": [{"message": message, "finish_reason": "tool_calls"}]}
        return {"choices": [{"message": {"role": "assistant", "content": "done"}, "finish_reason": "stop"}]}


class VllmPolicy:
    """Sketch: generate with your own vLLM engine and hand back its exact tokens.

    async def answer(self, request):
        prompt_ids = tokenizer.apply_chat_template(request.messages, tools=request.tools, add_generation_prompt=True)
        out = await engine.generate(prompt_ids, sampling_params)            # your policy, your weights
        return {"choices": [{"message": parse_tool_calls(out.text), "finish_reason": out.finish_reason,
                             "token_ids": out.token_ids, "logprobs": {"content": [...]}}],
                "prompt_token_ids": prompt_ids,
                "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(out.token_ids)}}
    """


async def serve_rollout(gate: Gate, rollout_id: str, policy: ScriptedPolicy) -> int:
    """Answer every call of one rollout until it exits or is unregistered; returns how many."""
    answered = 0
    async for request in gate.requests(rollout_id):
        await gate.deliver(request, await policy.answer(request))
        answered += 1
    return answered


async def simulated_agent(base_url: str, token: str) -> str:
    """Stands in for `run_rollout(RolloutRequest(..., base_url=base_url, api_key=token, model=...))`."""
    async with openai.AsyncOpenAI(base_url=base_url, api_key=token, max_retries=0) as llm:
        messages: list[Any] = [{"role": "user", "content": "list the files"}]
        while True:
            stream = await llm.chat.completions.create(model="policy", messages=messages, stream=True)
            content, calls = "", {}
            async for chunk in stream:
                delta = chunk.choices[0].delta if chunk.choices else None
                content += (delta.content or "") if delta else ""
                for call in (delta.tool_calls or []) if delta else []:
                    calls.setdefault(call.index, call)
            if not calls:
                return content
            messages.append({"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in calls.values()]})
            messages += [{"role": "tool", "tool_call_id": c.id, "content": "a.txt b.txt"} for c in calls.values()]


async def main() -> None:
    policy = ScriptedPolicy()
    async with Gate() as gate:
        rollouts = [await gate.register() for _ in range(ROLLOUTS)]
        servers = [asyncio.ensure_future(serve_rollout(gate, r.rollout_id, policy)) for r in rollouts]
        finals = await asyncio.gather(*(simulated_agent(r.base_url, r.token) for r in rollouts))
        for rollout in rollouts:
            await gate.unregister(rollout.rollout_id)
        counts = await asyncio.gather(*servers)
    for rollout, final, count in zip(rollouts, finals, counts):
        print(f"rollout {rollout.rollout_id[:8]}: {count} calls answered, final message {final!r}")


if __name__ == "__main__":
    asyncio.run(main())
