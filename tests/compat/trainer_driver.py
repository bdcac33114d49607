"""A trainer's side of loop-owning sessions, run in a virtualenv with openenv 0.10.0 and this package installed
without its server extra (as a trainer has it). Not run by pytest directly.

    python trainer_driver.py MODE URL ARGS_JSON     prints one JSON line: what the trainer saw

Modes: `group` (a GRPO-style group of rollouts through `RolloutSessionFactory`, checked against openenv's own
protocols and models), `close` (a rollout cancelled by `close()` while its model hangs), `imports` (the
trainer-side modules import here).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any


def imports() -> dict[str, Any]:
    import importlib

    names = ["coding_agent_env.client", "coding_agent_env.harness", "coding_agent_env.gate", "coding_agent_env.models",
             "coding_agent_env.llm.trace"]
    for name in names:
        importlib.import_module(name)
    server_only = [name for name in ("fastapi", "mcp.server", "uvicorn") if name in sys.modules]
    import mcp

    return {"imported": names, "mcp": getattr(mcp, "__version__", None) or _version("mcp"), "server_only": server_only}


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def group(url: str, args: dict[str, Any]) -> dict[str, Any]:
    from openenv.core.harness import LoopOwningSession, TrainableSession
    from openenv.core.harness.training import TrainingTrace

    from coding_agent_env.harness import RolloutSessionFactory

    factory = RolloutSessionFactory(url, defaults=args["defaults"])
    sessions = [factory.create(args["task"], seed=k, episode_id=f"group-{k}") for k in range(args["k"])]
    out: dict[str, Any] = {"rollouts": []}
    try:
        for session in sessions:
            out["loop_owning"] = isinstance(session, LoopOwningSession)
            out["trainable"] = isinstance(session, TrainableSession)
            code = session.wait_for_completion(timeout_s=600)
            entries = session.fetch_proxy_trace()
            trace = session.fetch_training_trace()
            assert isinstance(trace, TrainingTrace), type(trace)
            again = TrainingTrace.from_entries([e for e in entries if e["prompt_token_ids"]])
            out["rollouts"].append({
                "exit_code": code, "reward": session.verify([]).env_reward, "entries": len(entries),
                "trace_turns": len(trace.turns), "round_trip": _tokens(again) == _tokens(trace),
                "trainable_tokens": sum(sum(t.loss_mask) for t in trace.turns),
                "entry_keys": sorted(entries[0]) if entries else [],
                "node_ids": [e["metadata"]["node_id"] for e in entries],
                "seed": entries[0]["metadata"].get("seed") if entries else None,
            })
    finally:
        for session in sessions:
            session.close()
    return out


def _tokens(trace: Any) -> list[tuple[Any, ...]]:
    """What a trainer trains on, per turn: identity, ids, logprobs and mask."""
    return [(t.node_id, t.prompt_token_ids, t.completion_token_ids, t.per_token_logps, t.loss_mask)
            for t in trace.turns]


def close(url: str, args: dict[str, Any]) -> dict[str, Any]:
    from coding_agent_env.harness import HarnessError, RolloutSessionFactory

    session = RolloutSessionFactory(url, defaults=args["defaults"]).create(args["task"])
    try:
        session.wait_for_completion(timeout_s=args["wait_s"])
        timed_out = False
    except TimeoutError:
        timed_out = True
    started = time.monotonic()
    session.close()
    closed_s = time.monotonic() - started
    try:
        session.verify([])
        failure = None
    except HarnessError as exc:
        failure = str(exc)
    return {"timed_out": timed_out, "closed_s": closed_s, "failure": failure, "done": session.done}


def main() -> None:
    mode = sys.argv[1]
    if mode == "imports":
        out = imports()
    else:
        url, args = sys.argv[2], json.loads(sys.argv[3])
        out = group(url, args) if mode == "group" else close(url, args)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
