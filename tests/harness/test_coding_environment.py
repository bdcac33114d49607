"""`CodingEnvironment` as TRL's `GRPOTrainer(environment_factory=...)` drives it, against a real server of ours
(uvicorn in a thread, the local backend with bubblewrap): `reset(**row)` with a dataset row, `terminal` calls, then
`get_reward()`, the same instance reused for the next row, as TRL's pool does (trl 1.16 grpo_trainer.py: one
instance per concurrent rollout, `reset` before each, `get_reward` after)."""

from __future__ import annotations

import asyncio
import functools
import gc
import inspect
import json
import pickle
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any, get_type_hints

import pytest

from coding_agent_env.harness import AsyncCodingEnvironment, CodingEnvironment, ServerUnreachableError
from coding_agent_env.harness import environment as environment_module
from coding_agent_env.settings import Settings
from tests.helpers import leftovers, wait_until
from tests.protocol.live import LiveServer
from tests.unit import test_layers

TASK: dict[str, Any] = {
    "instruction": "Put 42 in answer.txt.",
    "files": {"answer.txt": "wrong\n"},
    "verify": ["grep -qx 42 answer.txt"],
    "sandbox": "local",
}
PROMPT = [{"role": "user", "content": "Solve the task with the terminal tool.\n\n"}]


def row(**task: Any) -> dict[str, Any]:
    """A dataset row as TRL passes it to `reset`: the prompt and the task's columns."""
    return {"prompt": PROMPT, **(task or TASK)}


def env_for(live: LiveServer, **options: Any) -> CodingEnvironment:
    return CodingEnvironment(live.http, message_timeout_s=60, **options)


def test_episodes_solved_and_not_over_one_reused_instance(live: LiveServer, settings: Settings) -> None:
    env = env_for(live, command_timeout_s=30)  # a task default every row gets
    assert live.sessions.active == 0  # connects on the first reset (TRL makes a probe instance up front)

    # 1: solved, with Arrow's None-filled columns and an oracle's solution in the row (both ignored).
    first = {**row(), "image": None, "solution": ["echo 42 > answer.txt"],
             "files": {"answer.txt": "wrong\n", "notes.txt": None}}
    text = env.reset(**first)
    assert text.startswith(TASK["instruction"]) and "Setup: none." in text
    assert env.terminal("cat answer.txt") == "wrong\n[exit code 0]"
    assert env.terminal("ls notes.txt").endswith("[exit code 2]")  # a None entry of `files` is no file
    assert env.terminal("export W=$(pwd) && cd /tmp && export X=7") == "[exit code 0]"
    assert env.terminal("echo $X; pwd") == "7\n/tmp\n[exit code 0]"  # one persistent shell
    assert env.terminal("cd \"$W\" && echo 42 > answer.txt && false") == "[exit code 1]"
    assert env.get_reward() == 1.0 and env.reward == 1.0
    assert env.get_reward() == 1.0  # asked again: the same value, nothing re-run
    assert env.report is not None and env.report["status"] == "completed"
    assert env.terminal("ls").startswith("Error: the episode has ended")
    assert live.sessions.active == 1

    # 2: the same instance, not solved: verified, reward 0.
    assert env.reset(**row()).startswith(TASK["instruction"])
    assert env.terminal("echo 41 > answer.txt") == "[exit code 0]"
    assert env.get_reward() == 0.0 and env.reward == 0.0 and env.report["status"] == "completed"

    # 3: upstream terminus_env's names; a reset in the middle of an episode ends it.
    upstream = {"instruction": "Put 42 in answer.txt.", "files": TASK["files"],
                "verify_scripts": ["", "grep -qx 42 answer.txt"], "sandbox_backend": "local"}
    env.reset(**row(**upstream))
    env.terminal("sleep 300 &")
    env.reset(**row(**upstream))
    env.terminal("echo 42 > answer.txt")
    assert env.get_reward() == 1.0
    assert live.sessions.active == 1  # one server session for all of them
    env.close()
    wait_until(lambda: live.sessions.active == 0 and not leftovers(settings), what="the session and its episodes gone")


def test_bad_commands_and_server_errors_are_text(make_live: Callable[..., LiveServer], settings: Settings) -> None:
    live = make_live(episode_max_output_bytes=1024)
    env = env_for(live)
    assert env.terminal("ls") == "Error: no episode is running (call reset first)."
    assert env.get_reward() == 0.0 and env.reward is None
    env.reset(**row(**TASK, command_timeout_s=2))
    refused = "Error calling tool 'terminal': "  # the server's text of a refused call, as it is
    assert env.terminal(3) == f"{refused}command must be a string, not int"  # type: ignore[arg-type]
    assert env.terminal("") == f"{refused}give a command or a final_answer (both are empty)"
    assert env.terminal("a\x00b") == f"{refused}command must not contain NUL bytes"
    assert env.terminal("sleep 30") == ("[timed out: the foreground job was interrupted (SIGINT); the shell and its "
                                        "background jobs live on]")
    long = env.terminal("seq 1 5000")
    assert long.startswith("1\n2\n") and long.endswith("5000\n[exit code 0]") and "bytes of output left out" in long
    assert env.get_reward() == 0.0 and env.reward == 0.0  # still usable: scored, not solved

    # A task the server refuses: the reset's text says so, and so do the tool and the reward.
    refused = env.reset(**row(instruction="x", setup_scripts=1))
    assert refused.startswith("The episode could not start: EXECUTION_ERROR:") and "setup_scripts" in refused
    assert env.terminal("ls").startswith("Error: no episode is running (the episode could not start: EXECUTION")
    assert env.get_reward() == 0.0 and env.reward is None
    elsewhere = env.reset(**row(**{**TASK, "sandbox": "e2b"}))
    assert elsewhere.startswith("The episode could not start: EXECUTION_ERROR:") and "e2b" in elsewhere

    # A setup that fails: the episode ended before it began, unscored.
    failed = env.reset(**row(**TASK, setup=["exit 3"]))
    assert failed.startswith(TASK["instruction"]) and "could not start (setup_failed)" in failed
    assert env.terminal("ls").startswith("Error calling tool")
    assert env.get_reward() == 0.0 and env.reward is None and env.report["status"] == "setup_failed"

    # A row that names no task: no episode, said so.
    assert env.reset(prompt=PROMPT, topic="math").startswith("No task: the row names no task")
    assert env.get_reward() == 0.0

    # A reply that does not come in time: the connection is dropped (the episode with it), said so; the next
    # reset connects again.
    slow = CodingEnvironment(live.http, message_timeout_s=6, **TASK)  # above a reset on a loaded machine
    slow.reset(prompt=PROMPT)
    assert slow.terminal("sleep 15") == "Error: the server did not answer in time; the episode has ended."
    assert slow.terminal("ls").startswith("Error: the episode has ended")
    assert slow.get_reward() == 0.0 and slow.reward is None
    assert slow.reset(prompt=PROMPT).startswith(TASK["instruction"])
    assert slow.terminal("echo 42 > answer.txt") == "[exit code 0]"
    assert slow.get_reward() == 1.0
    slow.close()
    env.close()
    wait_until(lambda: live.sessions.active == 0 and not leftovers(settings), what="everything torn down")


def test_expired_episode_and_capacity_are_text(make_live: Callable[..., LiveServer], settings: Settings) -> None:
    live = make_live(max_concurrent_envs=1, episode_idle_timeout_s=1.0)
    first, second = env_for(live), env_for(live, unscored_reward=None)
    first.reset(**row())
    full = second.reset(**row())
    assert full.startswith("The episode could not start: CAPACITY_REACHED:")
    assert second.terminal("ls").startswith("Error: no episode is running (the episode could not start: CAPACITY")
    assert second.get_reward() is None and second.reward is None  # TRL 1.16 leaves such a rollout out
    wait_until(lambda: first.terminal("ls").startswith("Error"), what="the idle timeout", timeout_s=15, interval_s=2.5)
    assert "expired" in first.terminal("ls")
    assert first.get_reward() == 0.0 and first.reward is None
    first.close()
    wait_until(lambda: live.sessions.active == 0, what="the first session closed")
    assert second.reset(**row()).startswith(TASK["instruction"])  # capacity again: it connects anew
    second.close()
    wait_until(lambda: live.sessions.active == 0 and not leftovers(settings), what="everything torn down")


def test_a_dead_server_raises_the_typed_error(make_live: Callable[..., LiveServer]) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    nowhere = CodingEnvironment(f"http://127.0.0.1:{port}", connect_timeout_s=2)
    with pytest.raises(ServerUnreachableError, match=f"cannot connect to http://127.0.0.1:{port}"):
        nowhere.reset(**row())
    assert isinstance(ServerUnreachableError("x"), Exception)

    live = make_live()
    env = env_for(live, connect_timeout_s=2)
    env.reset(**row())
    assert env.terminal("echo up") == "up\n[exit code 0]"
    live.stop()
    with pytest.raises(ServerUnreachableError):
        env.terminal("ls")  # TRL's tool loop turns this into {'error': ...}; reset and get_reward stop training
    with pytest.raises(ServerUnreachableError):
        env.get_reward()
    with pytest.raises(ServerUnreachableError):
        env.reset(**row())
    env.close()


def test_close_and_collection_end_the_session(live: LiveServer, settings: Settings) -> None:
    env = env_for(live)
    env.reset(**row())
    assert live.sessions.active == 1
    env.close()
    env.close()  # idempotent
    wait_until(lambda: live.sessions.active == 0 and not leftovers(settings), what="close() ended the session")
    assert env.terminal("ls").startswith("Error: no episode is running (the environment was closed)")
    env.reset(**row())  # a closed instance connects again on reset
    assert live.sessions.active == 1
    del env
    gc.collect()
    wait_until(lambda: live.sessions.active == 0 and not leftovers(settings), what="collection ended the session")
    with env_for(live) as scoped:
        scoped.reset(**row())
        assert live.sessions.active == 1
    wait_until(lambda: live.sessions.active == 0 and not leftovers(settings), what="the with block's end")


def test_the_async_variant(live: LiveServer, settings: Settings) -> None:
    """What TRL awaits: `terminal` and `get_reward` on its event loop; several instances side by side."""
    envs = [AsyncCodingEnvironment(live.http, message_timeout_s=60) for _ in range(3)]
    assert all(inspect.iscoroutinefunction(env.terminal) and inspect.iscoroutinefunction(env.get_reward)
               for env in envs)
    for env in envs:
        assert env.reset(**row()).startswith(TASK["instruction"])  # reset stays synchronous, as TRL calls it

    async def rollouts() -> tuple[list[str], list[float], float]:
        started = time.monotonic()
        slept = await asyncio.gather(*(env.terminal("sleep 2; echo slept") for env in envs))
        elapsed = time.monotonic() - started
        await asyncio.gather(envs[0].terminal("echo 42 > answer.txt"), envs[1].terminal("echo 7 > answer.txt"))
        return slept, list(await asyncio.gather(*(env.get_reward() for env in envs))), elapsed

    slept, rewards, elapsed = asyncio.run(rollouts())
    assert slept == ["slept\n[exit code 0]"] * 3 and elapsed < 5  # side by side, not one after another
    assert rewards == [1.0, 0.0, 0.0]
    for env in envs:
        env.close()
    wait_until(lambda: live.sessions.active == 0 and not leftovers(settings), what="every session closed")


def test_trls_pool_and_tool_loop_drive_it(live: LiveServer, settings: Settings) -> None:
    """TRL 1.16's own steps, re-done: a probe instance at init, the pool grown to the batch, `reset(**row)` per
    rollout, tools looked up by `__name__` and called with the model's arguments, `str()` of the result, then
    `get_reward()` per environment; the factory pickles (the async trainer's spawned worker needs that)."""
    factory = functools.partial(CodingEnvironment, live.http, message_timeout_s=60, sandbox="local")
    assert pickle.loads(pickle.dumps(factory)).func is CodingEnvironment
    pool = [factory()]  # grpo_trainer.py: the probe instance seeds the pool
    solve = {"name": "terminal", "arguments": {"command": "echo 42 > answer.txt"}}
    miss = {"name": "terminal", "arguments": {"command": "echo 7 > answer.txt"}}
    hallucinated = {"name": "terminal", "arguments": {"cmd": "ls"}}
    rewards = []
    for batch in ([row(), row()], [row(), row(**{**TASK, "task_id": "again"})]):
        environments = []
        for index in range(len(batch)):
            if index == len(pool):
                pool.append(factory())
            environments.append(pool[index])
        tool_dicts = [{tool.__name__: tool for tool in trl_tools(env)} for env in environments]
        for env, x in zip(environments, batch, strict=True):
            assert env.reset(**x).startswith(TASK["instruction"])
        for tools, call in zip(tool_dicts, (solve, miss), strict=True):
            assert str(tools[call["name"]](**call["arguments"])) == "[exit code 0]"
        with pytest.raises(TypeError):  # TRL catches this one and shows the model {'error': ...}
            tool_dicts[0][hallucinated["name"]](**hallucinated["arguments"])
        rewards.append([env.get_reward() for env in environments])
    assert rewards == [[1.0, 0.0], [1.0, 0.0]]
    assert len(pool) == 2 and live.sessions.active == 2  # one server session per pooled instance
    for env in pool:
        env.close()
    wait_until(lambda: live.sessions.active == 0 and not leftovers(settings), what="the pool's sessions closed")


# -- what TRL sees -----------------------------------------------------------------------------------------------


def trl_tools(env: object) -> list[Callable[..., Any]]:
    """The tools TRL 1.16 takes from an environment (trl/trainer/grpo_trainer.py `GRPOTrainer.__init__` and
    `_generate_and_score_completions`): the public functions of its class but `reset` and `get_reward`."""
    return [getattr(env, name) for name, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)
            if name not in ("reset", "get_reward") and not name.startswith("_")]


@pytest.mark.parametrize("cls", [CodingEnvironment, AsyncCodingEnvironment])
def test_trl_finds_reset_get_reward_and_one_tool(cls: type) -> None:
    env = cls("http://127.0.0.1:9")
    functions = dict(inspect.getmembers(type(env), predicate=inspect.isfunction))
    assert {"reset", "get_reward"} <= functions.keys()
    assert [tool.__name__ for tool in trl_tools(env)] == ["terminal"]
    # Older TRL listed the instance's bound methods: `close` is none either.
    methods = [name for name, _ in inspect.getmembers(env, predicate=inspect.ismethod) if not name.startswith("_")]
    assert methods == ["get_reward", "reset", "terminal"]
    assert callable(env.close) and "close" in dir(env)
    env.close()


# transformers 5.23.0, transformers/utils/chat_template_utils.py lines 61-75 (the docstring regexes), 256-286
# (`parse_google_format_docstring`) and 289-431 (`get_json_schema`), as TRL's chat template gets each tool.
DESCRIPTION_RE = re.compile(r"^(.*?)[\n\s]*(Args:|Returns:|Raises:|\Z)", re.DOTALL)
ARGS_RE = re.compile(r"\n\s*Args:\n(.*?)[\n\s]*(Returns:|Raises:|\Z)", re.DOTALL)
ARGS_SPLIT_RE = re.compile(
    r"""
(?:^|\n)  # Match the start of the args block, or a newline
([ \t]*)(\w+):\s*  # Capture the indentation and the argument name
(.*?)\s*  # Capture the argument description, which can span multiple lines, and strip trailing spacing
(?=\n(?!\1[ \t])[ \t]*\w+:|\Z)  # Stop at the next "name:" that is not indented deeper, or the end of the block
""",
    re.DOTALL | re.VERBOSE,
)
RETURNS_RE = re.compile(r"\n\s*Returns:\n\s*(.*?)[\n\s]*(Raises:|\Z)", re.DOTALL)


def schema_as_transformers_makes_it(func: Callable[..., Any]) -> dict[str, Any]:
    """`transformers.utils.get_json_schema` for a method whose arguments are `str`s (the only type `terminal`
    takes), re-done here: transformers is not installed in this suite's virtualenvs (it needs torch's stack)."""
    doc = (inspect.getdoc(func) or "").strip()
    assert doc, "get_json_schema refuses a function without a docstring"
    description = DESCRIPTION_RE.search(doc)
    args = ARGS_RE.search(doc)
    returns = RETURNS_RE.search(doc)
    lines = "\n".join(line for line in (args.group(1) if args else "").split("\n") if line.strip())
    arg_docs = {m[1]: re.sub(r"\s*\n+\s*", " ", m[2].strip()) for m in ARGS_SPLIT_RE.findall(lines)}
    hints = get_type_hints(func)
    signature = inspect.signature(func)
    properties: dict[str, Any] = {}
    for name, parameter in signature.parameters.items():
        assert parameter.annotation is not inspect.Parameter.empty, f"{name} has no type hint"
        assert hints[name] is str, "only str arguments are re-done here"
        assert name in arg_docs, f"get_json_schema refuses an argument without an Args: entry: {name}"
        properties[name] = {"type": "string", "description": arg_docs[name]}
    required = [name for name, p in signature.parameters.items() if p.default is inspect.Parameter.empty]
    parameters = {"type": "object", "properties": properties, **({"required": required} if required else {})}
    function: dict[str, Any] = {"name": func.__name__, "description": description.group(1).strip() if description
                                else None, "parameters": parameters}
    if hints.get("return") is str:
        function["return"] = {"type": "string", **({"description": returns.group(1).strip()} if returns else {})}
    return {"type": "function", "function": function}


@pytest.mark.parametrize("cls", [CodingEnvironment, AsyncCodingEnvironment])
def test_the_schema_trl_renders_for_terminal(cls: type) -> None:
    """The tool schema the model is shown: transformers' `get_json_schema` of the bound method (used for real when
    transformers is importable here, else re-done as its source does it, above)."""
    (terminal,) = trl_tools(cls("http://127.0.0.1:9"))
    schema = schema_as_transformers_makes_it(terminal)
    function = schema["function"]
    assert function["name"] == "terminal"
    assert function["description"] == (
        "Run one shell command in the task's sandbox: a persistent shell, where cd and export carry over.")
    assert function["parameters"] == {
        "type": "object",
        "properties": {"command": {
            "type": "string",
            "description": "The shell command to run, for example `ls -la` or `python3 -m pytest -q`.",
        }},
        "required": ["command"],
    }
    assert function["return"] == {"type": "string", "description": (
        "Its output (stdout and stderr; a long one cut in the middle), then its exit code or a timeout note.")}
    try:
        from transformers.utils import get_json_schema  # type: ignore[import-not-found]
    except ImportError:
        return
    assert get_json_schema(terminal) == schema


# -- what it needs -----------------------------------------------------------------------------------------------


def test_the_row_columns_are_the_servers_task_fields() -> None:
    from coding_agent_env.api.protocols.step import RESET_KEYS
    from coding_agent_env.api.tools.task_set import REF_KEYS
    from coding_agent_env.episode.task import AGENT_RUN_FIELDS, TASK_FIELDS, UPSTREAM_ALIASES

    assert environment_module.AGENT_RUN_FIELDS == AGENT_RUN_FIELDS
    assert environment_module.TASK_KEYS == TASK_FIELDS | UPSTREAM_ALIASES.keys()
    assert environment_module.SET_KEYS == REF_KEYS
    assert environment_module.ROW_KEYS == environment_module.TASK_KEYS | RESET_KEYS | REF_KEYS


def test_it_imports_with_the_harness_dependencies_only() -> None:
    """The layer rule (tests/unit/test_layers.py: the harness imports errors, urls, models, settings, llm, rollout
    of this package), and a fresh interpreter that imports both classes loads nothing of the server's."""
    harness = {module: targets for module, targets in test_layers.edges().items()
               if test_layers.layer(module) == "harness"}
    assert "coding_agent_env.harness.environment" in harness
    outside = {f"{module} -> {target}" for module, targets in harness.items() for target in targets
               if test_layers.layer(target) not in test_layers.ALLOWED["harness"] | {"harness"}}
    assert outside == set()
    code = (
        "import json, sys\n"
        "from coding_agent_env.harness import AsyncCodingEnvironment, CodingEnvironment\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    ours = {name.split(".")[1] for name in loaded if name.startswith("coding_agent_env.")}
    assert ours <= {"harness", "errors", "urls", "models", "settings", "verify_env"}, ours
    server_side = [name for name in loaded
                   if name.split(".")[0] in ("fastapi", "starlette", "uvicorn", "mcp", "gradio", "docker", "e2b")]
    assert server_side == []
