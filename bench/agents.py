"""End-to-end rollout time per agent (every CLI agent, and Terminus) with the instant scripted fake LLM, beside
running the same agent directly in the same run: no server, no sandbox, no relay, the agent talks to the fake
LLM itself. A CLI agent runs its own launcher with the same config; Terminus, whose loop runs in the server
for a rollout, runs as its standalone program (`terminus.loop`: the same conversation, commands in a host
shell). Target: rollout within 1.3x of the direct run (the agent's own start-up is the floor).

Also printed: the direct run followed by the task's verify commands run directly too (plain subprocesses in
the same workdir), so both sides do the same work; each agent's rollout phases (p50); and the fixed cost of a
rollout without an agent process (the `nop` agent, same verify: provision + verify + collect + teardown),
which no agent can go below.

    .venv/bin/python bench/agents.py [RUNS_PER_AGENT [AGENT ...]]
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._common import bench_settings  # noqa: E402
from coding_agent_env.agents.driver import SESSION_TITLE, launcher_script  # noqa: E402
from coding_agent_env.agents.registry import cli_specs, get_agent  # noqa: E402
from coding_agent_env.agents.spec import LaunchContext  # noqa: E402
from coding_agent_env.agents.terminus.agent import standalone_argv, standalone_config  # noqa: E402
from coding_agent_env.llm import Relay, Upstream  # noqa: E402
from coding_agent_env.models import RolloutRequest, RolloutStatus, Timings  # noqa: E402
from coding_agent_env.rollout import run_rollout  # noqa: E402
from coding_agent_env.settings import Settings  # noqa: E402
from tests.agents.sessions import CORRECT, TASK, VERIFY, session, write_file_command  # noqa: E402
from tests.fakes.llm import FakeLLM, FakeLLMServer  # noqa: E402

KEY = "sk-bench"
DIALECT_AGENTS = frozenset({"claude-code", "codex", "gemini-cli"})
"""Agents that speak a dialect other than chat completions (the relay translates)."""
MODEL = "fake/coder-1"


def direct_run(agent: str, settings: Settings, base_url: str, token: str = KEY) -> tuple[float, float]:
    """The agent run as a plain subprocess in a fresh HOME and workdir: (agent seconds, seconds of the task's
    verify commands then run the same way). A CLI agent runs its own launcher; Terminus runs as its
    standalone program (`terminus.loop`: the same conversation, commands in a host shell)."""
    root = tempfile.mkdtemp(prefix="cae-bench-direct-")
    try:
        home, work, agent_dir = (os.path.join(root, d) for d in ("home", "work", "agent"))
        for path in (home, work, agent_dir):
            os.makedirs(path)
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": root, "LANG": "C.UTF-8"}
        if agent == "terminus":
            config = os.path.join(agent_dir, "terminus.json")
            with open(config, "w", encoding="utf-8") as handle:
                handle.write(standalone_config(settings, base_url=base_url, model=MODEL, state_dir=agent_dir))
            argv, stdin = standalone_argv(config), TASK.encode()
            env["TERMINUS_API_KEY"] = KEY
        else:
            argv, stdin = cli_launch(agent, settings, base_url, home, work, agent_dir, env, token), None
        started = time.perf_counter()
        done = subprocess.run(argv, input=stdin, cwd=work, env=env, capture_output=True, timeout=300, check=False)
        elapsed = time.perf_counter() - started
        assert done.returncode == 0 and os.path.exists(os.path.join(work, "binary_search.py")), done.stderr[-2000:]
        started = time.perf_counter()
        for command in VERIFY:
            checked = subprocess.run(["bash", "-c", command], cwd=work, env=env, capture_output=True, timeout=60,
                                     check=False)
            assert checked.returncode == 0, checked.stderr[-2000:]
        return elapsed, time.perf_counter() - started
    finally:
        shutil.rmtree(root, ignore_errors=True)


def cli_launch(
    agent: str, settings: Settings, base_url: str, home: str, work: str, agent_dir: str, env: dict[str, str],
    token: str = KEY,
) -> list[str]:
    """Write a CLI agent's launch files and launcher as the driver would; its argv (and `env` completed)."""
    [spec] = [spec for spec in cli_specs() if spec.name == agent]
    prefix = str(settings.agents_dir / spec.prefix_name)
    ctx = LaunchContext(base_url=base_url, token=token, model=MODEL, home=home, workdir=work,
                        agent_dir=agent_dir, prefix=prefix, title=SESSION_TITLE)
    launch = spec.launch(ctx)
    for item in launch.files:
        os.makedirs(os.path.dirname(item.path), exist_ok=True)
        with open(item.path, "wb") as handle:
            handle.write(item.data())
    instruction = os.path.join(agent_dir, "instruction.md")
    with open(instruction, "w", encoding="utf-8") as handle:
        handle.write(TASK)
    env.update({**spec.extra_env, **launch.env})
    return ["bash", "-c", launcher_script(launch, ctx, instruction, os.path.join(agent_dir, "events.jsonl"))]


PHASES = ("provision", "setup", "agent", "verify", "collect", "teardown")


async def rollout(
    agent: str, settings: Settings, base_url: str, relay: Relay, reward: float = 1.0
) -> tuple[float, Timings]:
    request = RolloutRequest(instruction=TASK, agent=agent, base_url=base_url, api_key=KEY, model=MODEL,
                             verify=VERIFY, agent_timeout_s=300)
    started = time.perf_counter()
    result = await run_rollout(request, settings=settings, relay=relay)
    elapsed = time.perf_counter() - started
    assert result.status is RolloutStatus.COMPLETED and result.reward == reward, (result.error, result.agent_log_tail)
    return elapsed, result.timings


def ms(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1000:8.1f} ms"


def phases(timings: list[Timings]) -> str:
    return "  ".join(f"{p} {statistics.median(getattr(t, f'{p}_s') for t in timings) * 1000:.0f}" for p in PHASES)


async def main(runs: int, only: set[str]) -> None:
    # One relay for every rollout, as in the server (a rollout without one starts a private relay).
    with bench_settings() as settings, FakeLLMServer(FakeLLM(api_key=KEY)) as fake:
        async with Relay(settings) as relay:
            for agent in [spec.name for spec in cli_specs()] + ["terminus"]:
                if not only or agent in only:
                    await compare(agent, settings, fake, relay, runs)
            fixed = [await rollout("nop", settings, fake.base_url, relay, reward=0.0) for _ in range(runs)]
            print(f"{'nop':9} rollout p50 {ms([e for e, _ in fixed])}   (fixed cost without an "
                  f"agent process)   phases p50 (ms): {phases([t for _, t in fixed])}")


async def compare(agent: str, settings: Settings, fake: FakeLLMServer, relay: Relay, runs: int) -> None:
    get_agent(agent).check_available(settings)
    script = session(agent, write_file_command("binary_search.py", CORRECT))
    ours, direct, checked, timings = [], [], [], []
    for _ in range(runs):  # interleaved, so both see the same machine load
        fake.app.reset(list(script))
        if agent in DIALECT_AGENTS:
            # The fake speaks chat completions only: the direct run of an agent speaking another dialect goes
            # through a bare relay lease (translation only, no sandbox); bench/llm.py measures the translation.
            lease = await relay.open_lease("direct", Upstream(base_url=fake.base_url, api_key=KEY, model=MODEL))  # type: ignore[arg-type]
            try:
                agent_s, verify_s = await asyncio.to_thread(direct_run, agent, settings, lease.base_url, lease.token)
            finally:
                await lease.close()
        else:
            agent_s, verify_s = await asyncio.to_thread(direct_run, agent, settings, fake.base_url)
        direct.append(agent_s)
        checked.append(agent_s + verify_s)
        fake.app.reset(list(script))
        elapsed, timing = await rollout(agent, settings, fake.base_url, relay)
        ours.append(elapsed)
        timings.append(timing)
    ratio = statistics.median(ours) / statistics.median(direct)
    print(f"{agent:9} rollout p50 {ms(ours)}   direct p50 {ms(direct)}   ratio {ratio:4.2f}x   "
          f"(target <= 1.30x, {runs} runs)")
    both = statistics.median(ours) / statistics.median(checked)
    print(f"{'':9} direct + verify p50 {ms(checked)}   ratio {both:4.2f}x   (same work on both sides)")
    print(f"{'':9} phases p50 (ms): {phases(timings)}")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 3, set(sys.argv[2:])))
