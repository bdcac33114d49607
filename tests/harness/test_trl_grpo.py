"""A real GRPO run: `examples/trl_grpo.py` (TRL's `GRPOTrainer` with `environment_factory=CodingEnvironment`, a
real SmolLM2-135M on CPU) against a real server of ours (uvicorn in a thread, the local backend with bubblewrap),
in a side virtualenv with TRL, torch and this checkout without its server extra (`tests.compat.venvs.trl_trainer`).

What it proves: the trainer finishes both steps; TRL logs the environment's reward column under the name it derives
from the class (`rewards/CodingEnvironment/mean`); every generation was one episode that the server ran to its
end and verified (its log says `episode <id> ended: completed` for exactly the episodes the example saw, one per
generation; `/metrics` counts as many completed episodes and final answers); and when the trainer has gone, no session, sandbox process, mount, directory or cgroup is left.

Skipped when the side virtualenv cannot be made because pip cannot reach the package index.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from coding_agent_env.settings import Settings
from tests.compat import venvs
from tests.helpers import leftovers, wait_until
from tests.protocol.live import LiveServer

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "trl_grpo.py"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHED_MODEL = Path("/var/cache/cae-llama/11434.0.0-portable") / MODEL_FILE
"""The machine's copy of the model, if any; otherwise the example fetches it (pip) into `.ci/venvs/models/`."""
STEPS = 2
RUN_DEADLINE_S = 900.0  # measured: ~80 s on 2 cores (model load ~10 s, ~15-20 s a step); a fetch adds a minute
EPISODE_ENDED = "episode %s ended: %s"  # coding_agent_env.episode.episode's log line, one per episode


@pytest.fixture(scope="module")
def trl_python() -> Path:
    """Python of the side virtualenv (made once; this checkout is installed editable, so no reinstall)."""
    try:
        return venvs.trl_trainer(reinstall=False)
    except venvs.IndexUnreachable as exc:
        pytest.skip(f"no TRL virtualenv ({exc}): `python3 -m tests.compat.venvs` builds it from PyPI (.ci/run does)")
    except venvs.InstallFailed as exc:
        raise AssertionError(str(exc)) from None


def run_example(python: Path, url: str, workdir: Path) -> tuple[int, str, str]:
    """Run the example to its end (or kill its process group at the deadline and fail): exit code, stdout,
    stderr."""
    model = CACHED_MODEL if CACHED_MODEL.is_file() else venvs.VENVS / "models" / MODEL_FILE
    env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(
        [str(python), str(EXAMPLE), url, "--model", str(model), "--steps", str(STEPS),
         "--output-dir", str(workdir / "out")],
        cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=RUN_DEADLINE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"the GRPO run passed its {RUN_DEADLINE_S:g} s deadline:\n{out[-3000:]}\n{err[-3000:]}")
    return proc.returncode, out, err


def test_grpo_trains_two_steps_on_verified_episodes(
    trl_python: Path, make_live: Callable[..., LiveServer], settings: Settings, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="coding_agent_env")
    # TRL's pool: one instance per concurrent rollout (the probe is the first), each holding a session; one spare.
    live = make_live(max_concurrent_envs=3)

    code, out, err = run_example(trl_python, live.http, tmp_path)
    assert code == 0, f"the example failed ({code}):\n{out[-3000:]}\n{err[-5000:]}"
    summary = json.loads(out.strip().splitlines()[-1])

    # Both steps ran, and TRL logged the environment's reward column (named after the class) at each.
    assert [step["step"] for step in summary["steps"]] == [1, 2], out[-3000:]
    logged = out + err
    assert logged.count("'rewards/CodingEnvironment/mean'") == STEPS, logged[-3000:]
    for step in summary["steps"]:
        assert 0.0 <= step["reward"] <= 1.0

    # One episode per generation, each verified; the server's own log names exactly those episodes as completed.
    generations = STEPS * summary["generation_batch_size"]
    seen = {episode["episode_id"]: episode for episode in summary["episodes"]}
    assert len(seen) == generations == sum(step["episodes"] for step in summary["steps"]), summary
    assert all(e["status"] == "completed" and e["reward"] in (0.0, 1.0) for e in seen.values()), summary
    ended = [r.args for r in caplog.records if r.msg == EPISODE_ENDED and isinstance(r.args, tuple)]
    assert sorted(ended) == sorted((episode_id, "completed") for episode_id in seen), ended
    # The server's own count, as an operator sees it (`/metrics`): that many episodes completed and verified.
    families = text_string_to_metric_families(httpx.get(f"{live.http}/metrics", timeout=10).text)
    counted = {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
               for family in families for sample in family.samples}
    assert counted[("coding_agent_env_episodes_finished_total", (("status", "completed"),))] == generations
    assert counted[("coding_agent_env_episode_calls_total", (("call", "final_answer"),))] == generations

    # The example closed its environments: every session and every sandbox is gone.
    wait_until(lambda: live.sessions.active == 0, "the trainer's sessions to close", timeout_s=30)
    wait_until(lambda: not leftovers(settings), lambda: f"no leftovers, still: {leftovers(settings)}", timeout_s=30)
    print("\n".join(line for line in out.splitlines() if line.startswith("step ")))
