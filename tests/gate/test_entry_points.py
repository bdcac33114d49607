"""The gate as its own process (`coding-agent-env gate` -> gate.cli.main) and the runnable example."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import openai

from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 20.0


def test_gate_process_answers_with_its_policy_and_keeps_tokens_out_of_stdout(tmp_path: Path) -> None:
    tokens = tmp_path / "rollouts.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "coding_agent_env.gate.process", "--rollouts", "2", "--tokens-file", str(tokens)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )
    try:

        def started() -> bool:
            assert proc.poll() is None, "the gate exited"
            return tokens.exists() and len(tokens.read_text().splitlines()) == 2

        wait_until(started, "the gate to write both rollouts' tokens", timeout_s=DEADLINE_S)
        assert tokens.stat().st_mode & 0o777 == 0o600
        entries = [json.loads(line) for line in tokens.read_text().splitlines()]
        with openai.OpenAI(base_url=entries[0]["base_url"], api_key=entries[0]["api_key"], max_retries=0, timeout=10) as llm:
            reply = llm.chat.completions.create(model="m", messages=[{"role": "user", "content": "ping"}])
        assert reply.choices[0].message.content == "echo: ping"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
    assert proc.returncode == 0, err
    assert all(e["api_key"].encode() not in out + err for e in entries)


def test_example_trainer_loop_runs() -> None:
    done = subprocess.run([sys.executable, "examples/trainer_loop.py"], cwd=ROOT, capture_output=True, text=True,
                          timeout=DEADLINE_S, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("2 calls answered, final message 'done'") == 4
