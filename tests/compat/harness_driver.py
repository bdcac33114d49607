"""Run inside openenv 0.10's virtualenv (not by pytest): openenv's own white-box loop drives interactive
episodes through `coding_agent_env.harness` (imported from the checkout: PYTHONPATH), with a scripted model
step standing in for the trainer's model (a fake LLM: it returns fixed tool calls and token ids).

    python harness_driver.py BASE_URL     prints one JSON line: what openenv's loop produced
"""

from __future__ import annotations

import json
import sys
from typing import Any

from openenv.core.harness import HarnessRunLimits, MCPHarnessAdapter, ModelStepResult, build_harness_rollout_func
from openenv.core.llm_client import LLMResponse, ToolCall

from coding_agent_env.harness import EpisodeSessionFactory

TASK = {
    "instruction": "Write 42 to work/answer.txt, then answer 42.",
    "setup_scripts": "mkdir -p work",
    "verify_scripts": ['test "$(cat "$FINAL_ANSWER_FILE")" = 42', "grep -qx 42 work/answer.txt"],
}
SCRIPTS = {
    "solves": [{"command": "cd work && echo 42 > answer.txt", "final_answer": ""},
               {"command": "ls", "final_answer": "42"},  # both keys non-empty: refused, the model sees why
               {"command": "cat answer.txt; pwd", "final_answer": ""},
               {"command": "", "final_answer": "42"}],
    "wrong": [{"command": "", "final_answer": "41"}],
}


def scripted(script: list[dict[str, str]]) -> Any:
    def model_step(messages: list[dict[str, Any]], tools: list[Any], sampling: dict[str, Any]) -> ModelStepResult:
        turn = sum(1 for message in messages if message["role"] == "assistant")
        assert [tool.name for tool in tools] == ["terminal"], tools
        call = ToolCall(id=f"call-{turn}", name="terminal", args=script[turn])
        return ModelStepResult(response=LLMResponse(content="", tool_calls=[call]), prompt_ids=[turn],
                               completion_ids=[100 + turn], logprobs=[-0.5])

    return model_step


def main() -> None:
    factory = EpisodeSessionFactory(sys.argv[1], message_timeout_s=120)
    session = factory.create(TASK, seed=3, episode_id="harness-1")
    try:
        opening = session.initial_messages()
        rollout = MCPHarnessAdapter().run_white_box(scripted(SCRIPTS["solves"]), session,
                                                     HarnessRunLimits(max_turns=8))
        verified = session.verify(rollout.messages)
    finally:
        session.close()
    tool_messages = [m["content"] for m in rollout.messages if m["role"] == "tool"]
    # TRL's entry point: openenv's rollout function (create, run_white_box, verify, close per prompt).
    rewards = []
    for name in ("solves", "wrong"):
        func = build_harness_rollout_func(session_factory=factory, harness_adapter=MCPHarnessAdapter(),
                                          model_step_builder=lambda trainer, s, n=name: scripted(SCRIPTS[n]))
        rewards.append(func([TASK], None))
    print(json.dumps({
        "opening": opening, "done": rollout.done, "tool_messages": tool_messages,
        "errors": [entry.result.error for entry in rollout.tool_trace],
        "env_reward": verified.env_reward, "verify_done": verified.done, "metrics": verified.metrics,
        "completion_ids": rollout.completion_ids, "trl": [r["env_reward"] for r in rewards],
    }))


if __name__ == "__main__":
    main()
