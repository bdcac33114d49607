"""Training data from a rollout's recorded calls: the graph's classification on each turn, a training trace that
OpenEnv 0.10's `openenv.core.harness.training.TrainingTrace` validates unchanged, the per-path sequences a
trainer can feed directly, and TRL's `TraceEntry` records.

Rules (the engine's tokens are the truth; nothing is re-tokenised):

- a call is in the training trace only when the upstream returned its prompt ids (`prompt_token_ids`): without
  them its place in a token sequence is unknown, and OpenEnv's validator refuses it;
- `loss_mask` is 0 over the prompt and, over the completion, 1 only for a trainable call: `main`, `compaction`
  or `subagent` purpose with logprobs that are present, finite, not positive and aligned with the sampled ids;
- a call with bad logprobs (missing, misaligned, NaN, positive) stays as context: its logprobs are replaced by
  0.0 placeholders under mask 0 and its `note` says why; nothing raises, and the reward is untouched;
- `reward` mirrors the rollout's reward and stays null when it was not scored, never 0;
- each call's `policy_version` (the trainer's weight version that produced it, see `Turn.policy_version`) is in
  its trace turn's `metadata` (OpenEnv's `TrainingTurn` forbids keys of its own but takes any `metadata`), so an
  async trainer can drop calls sampled by a stale policy;
- a call the relay cut before it was answered (the agent's phase ended, the rollout was cancelled, the agent hung
  up: `CUT_ERRORS`) is recorded as cut: outside the graph, no purpose, never trainable, its note says so (it
  is not an agent's restarted conversation, which is what an unanswered call would otherwise look like).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from coding_agent_env.llm.graph import Node, RolloutGraph, build_graph, full_prompts
from coding_agent_env.models import TrainingData, TrainingSequence, Turn

__all__ = ["CUT_ERRORS", "annotate", "trace_entries", "training_data"]

_TRAINED_PURPOSES = frozenset(("main", "compaction", "subagent"))
CUT_ERRORS = frozenset(("lease closed", "call cancelled", "client disconnected"))
"""A turn's `error` when the relay ended the call for the agent's side, not the LLM's."""


def annotate(turns: Sequence[Turn], rollout_id: str) -> tuple[list[Turn], RolloutGraph]:
    """`turns` with `node_id`, `parent`, `purpose`, `trainable` and `note` filled in, and their graph (cut calls
    outside it)."""
    cut = [turn for turn in turns if turn.error in CUT_ERRORS]
    graph = build_graph([turn for turn in turns if turn.error not in CUT_ERRORS])
    out = [turn.model_copy(update={
        "node_id": f"{rollout_id}:{turn.turn}", "parent": None, "purpose": None, "trainable": False,
        "note": f"cut: {turn.error} before its answer was whole",
    }) for turn in cut]
    for node in graph.nodes:
        node.logps_ok = _logps_problem(node.turn) is None
        trainable, note = _trainable(node)
        out.append(node.turn.model_copy(update={
            "node_id": f"{rollout_id}:{node.turn.turn}", "parent": node.parent, "purpose": node.purpose,
            "trainable": trainable, "note": note,
        }))
        node.turn = out[-1]
    return sorted(out, key=lambda turn: turn.turn), graph


def training_data(graph: RolloutGraph, *, rollout_id: str, task_id: str, reward: float | None) -> TrainingData:
    """The trace and sequences of an annotated graph (see `annotate`)."""
    turns = []
    for node in graph.nodes:
        if not node.by_ids:
            continue
        turn = node.turn
        completion = list(turn.completion_token_ids)
        turns.append({
            "node_id": turn.node_id,
            "prompt_token_ids": list(turn.prompt_token_ids or []),
            "completion_token_ids": completion,
            "per_token_logps": _logps(node),
            "loss_mask": [0] * node.prompt_len + [1 if turn.trainable else 0] * len(completion),
            "metadata": _metadata(node, graph, rollout_id, task_id),
        })
    sequences = [_sequence(path) for path in graph.paths() if path[-1].by_ids and all(n.by_ids for n in path)]
    return TrainingData(trace={"schema_version": 1, "turns": turns}, sequences=sequences, reward=reward)


def trace_entries(turns: Sequence[Turn], training: TrainingData | None, reward: float | None) -> list[dict[str, Any]]:
    """One TRL / OpenEnv `TraceEntry` dict per call, in order: the whole `request` (messages and tools), the
    `response` (choice 0), the token fields, `loss_mask` (all 0 for a call outside the training trace),
    `reward` and `metadata` (with `node_id`)."""
    masks = {t["node_id"]: t for t in (training.trace["turns"] if training is not None else [])}
    ordered = sorted(turns, key=lambda t: t.turn)
    out = []
    for turn, (messages, tools) in zip(ordered, full_prompts(ordered)):
        traced = masks.get(turn.node_id)
        prompt = list(turn.prompt_token_ids or [])
        completion = list(turn.completion_token_ids)
        message = {"role": "assistant", "content": turn.message.content}
        if turn.message.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in turn.message.tool_calls
            ]
        if turn.message.reasoning_content:
            message["reasoning_content"] = turn.message.reasoning_content
        out.append({
            "request": {"messages": messages, "tools": tools},
            "response": {"choices": [{"index": 0, "message": message, "finish_reason": turn.finish_reason}]},
            "prompt_token_ids": prompt,
            "completion_token_ids": completion,
            "completion_tokens": list(turn.completion_tokens),
            "per_token_logps": traced["per_token_logps"] if traced else list(turn.per_token_logps),
            "loss_mask": traced["loss_mask"] if traced else [0] * (len(prompt) + len(completion)),
            "reward": reward,
            "metadata": {**traced["metadata"], "node_id": turn.node_id} if traced else {
                "node_id": turn.node_id, "turn": turn.turn, "purpose": turn.purpose, "trainable": False,
                "note": turn.note, "policy_version": turn.policy_version,
            },
        })
    return out


def _trainable(node: Node) -> tuple[bool, str | None]:
    turn = node.turn
    if not node.by_ids:
        return False, "the upstream returned no valid prompt token ids"
    if not turn.completion_token_ids:
        return False, "the upstream returned no valid completion token ids"
    problem = _logps_problem(turn)
    if problem is not None:
        return False, problem
    if node.purpose not in _TRAINED_PURPOSES:
        return False, f"a {node.purpose} call"
    return True, None


def _logps_problem(turn: Turn) -> str | None:
    logps = turn.per_token_logps
    if not logps:
        return "no logprobs"
    if len(logps) != len(turn.completion_token_ids):
        return f"{len(logps)} logprobs for {len(turn.completion_token_ids)} sampled ids"
    if not all(math.isfinite(lp) and lp <= 0 for lp in logps):
        return "logprobs not finite or positive"
    return None


def _logps(node: Node) -> list[float]:
    """The call's logprobs when valid; 0.0 placeholders (under mask 0) otherwise, so the trace validates."""
    if node.logps_ok:
        return list(node.turn.per_token_logps)
    return [0.0] * len(node.turn.completion_token_ids)


def _metadata(node: Node, graph: RolloutGraph, rollout_id: str, task_id: str) -> dict[str, Any]:
    turn = node.turn
    parent = graph.nodes[graph.index[node.parent]].turn.node_id if node.parent is not None else None
    return {
        "rollout_id": rollout_id, "task_id": task_id, "turn": turn.turn, "purpose": turn.purpose,
        "parent": parent, "trainable": turn.trainable, "note": turn.note, "finish_reason": turn.finish_reason,
        "policy_version": turn.policy_version,
        # The time split per call: the LLM's share (the rest of the agent's time is the environment's).
        "latency_s": round(turn.latency_s, 6), "timestamp": turn.timestamp,
    }


def _sequence(path: list[Node]) -> TrainingSequence:
    """One root-to-leaf path as a single token sequence: the leaf's prompt (which holds every ancestor's prompt
    and completion) and its completion, with each call's completion span masked by its own trainability."""
    leaf = path[-1]
    ids = [*(leaf.turn.prompt_token_ids or []), *leaf.turn.completion_token_ids]
    mask = [0] * len(ids)
    logps = [0.0] * len(ids)
    for node in path:
        start = node.prompt_len
        values = _logps(node)
        for k, value in enumerate(values):
            logps[start + k] = value
            mask[start + k] = 1 if node.turn.trainable else 0
    return TrainingSequence(
        node_ids=[node.turn.node_id for node in path],
        purpose=leaf.turn.purpose or "main",
        input_ids=ids,
        loss_mask=mask,
        logprobs=logps,
    )
