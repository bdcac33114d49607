"""`coding-agent-env gate`: run a gate as its own process with a policy that answers every call.

    coding-agent-env gate --rollouts 4 --tokens-file rollouts.jsonl --policy mypkg.policy:answer

Registers N rollouts and writes one JSON line per rollout (`rollout_id`, `base_url`, `api_key`) to the
tokens file (mode 0600; tokens never go to stdout or argv). The policy is `module:function`, an async
function `(GateRequest) -> chat completion dict`; `echo` (the default) answers with the last user message.
Runs until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import signal
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from coding_agent_env.gate.gate import Gate
from coding_agent_env.gate.state import GateRequest
from coding_agent_env.settings import Settings

__all__ = ["echo_policy", "main"]

Policy = Callable[[GateRequest], Awaitable[Any]]


async def echo_policy(request: GateRequest) -> dict[str, Any]:
    """Answer with the text of the last user message (a smoke-test policy)."""
    text = next((m.get("content") for m in reversed(request.messages) if isinstance(m, dict) and m.get("role") == "user"), "")
    content = text if isinstance(text, str) else json.dumps(text)
    return {"choices": [{"message": {"role": "assistant", "content": f"echo: {content}"}, "finish_reason": "stop"}]}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="coding-agent-env gate", description="Trainer-side LLM gate.")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1; 0.0.0.0 is explicit)")
    parser.add_argument("--port", type=int, default=0, help="port (default: OS-chosen)")
    parser.add_argument("--rollouts", type=int, default=1, help="rollouts to register")
    parser.add_argument("--tokens-file", type=Path, required=True, help="where to write rollout URLs and tokens")
    parser.add_argument("--policy", default="echo", help="module:function async policy, or 'echo'")
    return parser


def _load_policy(spec: str) -> Policy:
    if spec == "echo":
        return echo_policy
    module, _, name = spec.partition(":")
    if not module or not name:
        raise SystemExit(f"--policy must be module:function, got {spec!r}")
    policy: Policy = getattr(importlib.import_module(module), name)
    return policy


async def _serve(args: argparse.Namespace, policy: Policy) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with Gate(Settings.from_env(), host=args.host, port=args.port) as gate:
        rollouts = [await gate.register() for _ in range(args.rollouts)]
        fd = os.open(args.tokens_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            for r in rollouts:
                out.write(json.dumps({"rollout_id": r.rollout_id, "base_url": r.base_url, "api_key": r.token}) + "\n")
        print(f"gate listening on {gate.base_url} with {len(rollouts)} rollouts; tokens in {args.tokens_file}", flush=True)

        async def answer(rollout_id: str) -> None:
            async for request in gate.requests(rollout_id):
                await gate.deliver(request, await policy(request))

        workers = [asyncio.ensure_future(answer(r.rollout_id)) for r in rollouts]
        await stop.wait()
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for `coding-agent-env gate ...` (argv excludes the `gate` word)."""
    args = _parser().parse_args(argv)
    asyncio.run(_serve(args, _load_policy(args.policy)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
