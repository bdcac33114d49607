"""One rollout in a process of its own, for a test to run under a tracer: reads {"request", "state_dir",
"uid_base"} as JSON on stdin, runs the request on the local backend with those settings, prints the result
(JSON) on stdout.

    python -m tests.agents.traced_rollout < args.json
"""

from __future__ import annotations

import asyncio
import json
import sys

from coding_agent_env.models import RolloutRequest
from coding_agent_env.rollout import run_rollout
from coding_agent_env.settings import LocalConfig, Settings


def main() -> None:
    args = json.load(sys.stdin)
    settings = Settings(state_dir=args["state_dir"], backends=(LocalConfig(uid_base=args["uid_base"], uid_count=64),))
    result = asyncio.run(run_rollout(RolloutRequest.model_validate(args["request"]), settings=settings))
    print(result.model_dump_json())


if __name__ == "__main__":
    main()
