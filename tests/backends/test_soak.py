"""Soak: 200 rollouts spread over every backend, a third of them cancelled at a random stage, a random
moment into it, by either of the two ways a rollout is cancelled (the task is cancelled, as on a client
disconnect; or the `cancel` event is set, as on a UI's Stop). Afterwards nothing may be left: no container,
no process, no mount, no sandbox directory, no relay socket.

Engines: local bubblewrap (and its unisolated fallback), a real dockerd, hf-sandbox's own server on loopback,
and the e2b SDK's fake (the E2B cloud is unreachable here). One server configuration enables all of them and
each request picks its backend, as a trainer spreading load would.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections import Counter
from typing import Any

import pytest

from coding_agent_env.models import RolloutRequest, RolloutStatus
from coding_agent_env.rollout import events as ev
from coding_agent_env.rollout import run_rollout
from coding_agent_env.sandbox import Backends, SandboxBackend
from coding_agent_env.settings import BackendConfig, Settings
from tests.backends.conftest import kind_configs
from tests.helpers import leftovers

ROLLOUTS = 200
CONCURRENCY = 8
CANCEL_EVERY = 3
# local twice: it is the default backend and the cheapest, so it carries the most load.
KINDS = ("local", "local", "docker", "hf", "e2b-fake")
STAGES = ("provision", "setup", "agent", "verify", "collect")


def _all_backends(request: pytest.FixtureRequest, settings: Settings) -> Backends:
    """One operator configuration enabling every backend of this machine's engines."""
    picked = [kind_configs(kind, request, settings) for kind in ("docker", "hf", "e2b-fake")]
    configs: dict[str, BackendConfig] = {config.kind: config for _, more, _ in picked for config in more}
    enabled = settings.with_backends(*configs.values())
    stand_ins: dict[str, SandboxBackend] = {}
    for _, _, make in picked:
        stand_ins.update(make(enabled))
    return Backends(enabled, overrides=stand_ins)


async def test_two_hundred_rollouts_across_backends_with_random_cancellations_leave_nothing(
    request: pytest.FixtureRequest, settings: Settings
) -> None:
    seed = int(os.environ.get("SOAK_SEED", random.randrange(2**32)))
    rng = random.Random(seed)
    async with _all_backends(request, settings) as server:
        await _soak(rng, seed, server, settings)


async def _soak(rng: random.Random, seed: int, server: Backends, settings: Settings) -> None:
    task = RolloutRequest(
        instruction="write the answer",
        agent="oracle",
        setup=["echo setup > s.txt"],
        # A grandchild that ignores SIGTERM and outlives its parent: cancellation must still reap it.
        solution=["(trap '' TERM; sleep 0.2; echo 42 > answer) & wait"],
        verify=["grep -qx 42 answer", "test -f s.txt"],
    )
    gate = asyncio.Semaphore(CONCURRENCY)
    outcomes: Counter[str] = Counter()
    seconds: Counter[str] = Counter()
    failures: list[str] = []

    async def one(index: int) -> None:
        kind = KINDS[index % len(KINDS)]
        backend = {"e2b-fake": "e2b", "local": "local"}.get(kind, kind)
        req = task.model_copy(update={"sandbox": backend, "task_id": f"soak-{index}"})
        cancels = index % CANCEL_EVERY == 0
        stage, delay, by_event = rng.choice(STAGES), rng.uniform(0, 0.05), rng.random() < 0.5
        cancel = asyncio.Event()
        loop = asyncio.get_running_loop()
        async with gate:
            holder: list[asyncio.Future[Any]] = []

            def on_event(event: ev.RolloutEvent) -> None:
                if cancels and isinstance(event, ev.PhaseStarted) and event.phase == stage:
                    # A random moment into the stage, not a wait: the cancellation's timing is the variable.
                    loop.call_later(delay, cancel.set if by_event else holder[0].cancel)

            started = loop.time()
            running = asyncio.ensure_future(
                run_rollout(req, settings=server.settings, backends=server, emit=on_event, cancel=cancel)
            )
            holder.append(running)
            try:
                try:
                    result = await asyncio.wait_for(running, 120)
                finally:
                    seconds[kind] += loop.time() - started
            except asyncio.CancelledError:
                if not (cancels and not by_event) or not running.cancelled():
                    raise
                outcomes[f"{kind}: task cancelled"] += 1
                return
            if result.status is RolloutStatus.COMPLETED and result.reward == 1.0:
                outcomes[f"{kind}: passed"] += 1
            elif cancels and by_event and result.status is RolloutStatus.CANCELLED:
                outcomes[f"{kind}: cancelled"] += 1
            else:
                failures.append(f"#{index} {kind} cancel={cancels and (stage, by_event)}: {result.status} "
                                f"{result.reward} {result.error}")

    await asyncio.gather(*(one(i) for i in range(ROLLOUTS)))
    print(f"soak seed {seed}: {dict(outcomes)}; rollout-seconds per backend {dict(seconds)}")
    assert not failures, f"seed {seed}: {failures[:5]}"
    assert sum(outcomes.values()) == ROLLOUTS, outcomes
    # A cancellation that lands after the rollout finished leaves it passed: most must still be cancellations.
    assert sum(n for k, n in outcomes.items() if "cancel" in k) >= ROLLOUTS // CANCEL_EVERY // 2, outcomes
    left = leftovers(settings)
    assert not left, f"seed {seed}: left behind {left}"
    # Containers: `no_leftover_containers` (pulled in by the docker engine settings) asserts none is left.
