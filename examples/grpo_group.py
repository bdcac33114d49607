"""A GRPO-style group through loop-owning sessions: K rollouts of one task at once, each a CLI agent owning its
loop, then per rollout the reward, the training sequences and trainable tokens, and the group's advantages.

    python examples/grpo_group.py TASK.yaml --server http://127.0.0.1:8000 --agent opencode \\
        --base-url http://127.0.0.1:8001/v1 --model Qwen/Qwen3-4B --k 8      # the key: $LLM_API_KEY

Without `--server` the rollouts run in this process (the local sandbox). The LLM key is read from the
environment (`LLM_API_KEY`), never from argv. Rollouts that were not scored (an infra failure) keep a null
reward and are left out of the group baseline: never counted as 0. A trainer feeds `training.sequences` (ids,
loss mask, the sampler's logprobs) with each rollout's advantage to its loss; nothing is re-tokenised.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any

import yaml

from coding_agent_env.harness import RolloutSessionFactory


def run_group(factory: RolloutSessionFactory, task: dict[str, Any], k: int, timeout_s: float) -> list[dict[str, Any]]:
    """Start `k` rollouts of `task` at once, wait for each; one summary per rollout, advantages included."""
    sessions = [factory.create(task, seed=i, episode_id=f"group-{i}") for i in range(k)]
    rows = []
    try:
        for session in sessions:
            session.wait_for_completion(timeout_s=timeout_s)
            result = session.result
            reward = session.verify([]).env_reward
            sequences = result.training.sequences if result.training is not None else []
            rows.append({"rollout_id": result.rollout_id, "status": result.status.value, "reward": reward,
                         "sequences": len(sequences),
                         "trainable_tokens": sum(sum(s.loss_mask) for s in sequences)})
    finally:
        for session in sessions:
            session.close()
    scored = [row["reward"] for row in rows if row["reward"] is not None]
    baseline = statistics.fmean(scored) if scored else None
    for row in rows:
        row["advantage"] = None if row["reward"] is None or baseline is None else row["reward"] - baseline
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("task", help="a request file (YAML or JSON): instruction, files, verify, ...")
    parser.add_argument("--server", help="a coding-agent-env server URL; default: in-process")
    parser.add_argument("--agent", default="opencode")
    parser.add_argument("--base-url", required=True, help="the policy's OpenAI-compatible URL (vLLM, the gate)")
    parser.add_argument("--model", required=True)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--timeout-s", type=float, default=1800.0)
    args = parser.parse_args(argv)
    with open(args.task, encoding="utf-8") as handle:
        task = yaml.safe_load(handle)
    defaults = {"agent": args.agent, "base_url": args.base_url, "api_key": os.environ.get("LLM_API_KEY", "none"),
                "model": args.model, "mode": "transparent_proxy", "top_logprobs": 1}
    factory = RolloutSessionFactory(args.server, defaults=defaults)
    rows = run_group(factory, {**task, "agent": args.agent}, args.k, args.timeout_s)
    for row in rows:
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
