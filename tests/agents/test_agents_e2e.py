"""The real agents (OpenCode and Pi from npm, the built-in Terminus) through the real pipeline, in the local
bubblewrap sandbox, against the scripted fake LLM behind the relay."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from coding_agent_env.models import RolloutRequest, RolloutResult, RolloutStatus
from coding_agent_env.rollout import run_rollout
from coding_agent_env.settings import Settings
from tests.agents.conftest import SERVER_KEY
from tests.agents.sessions import AGENTS, CORRECT, TASK, VERIFY, WRONG, finish, session, write_file_command
from tests.compat.conftest import gen_b  # noqa: F401 (a fixture)
from tests.fakes.llm import FakeLLMServer, Reply
from tests.llm.test_trace import openenv_validates

pytestmark = [pytest.mark.usefixtures("assert_no_leftovers"), pytest.mark.parametrize("agent", AGENTS)]

# A regex, so that the scanning command's own argv does not contain the key it looks for.
SCAN = (
    "grep -rlE 'sk-serve[r]-held' /workspace /home /tmp /logs /run /etc > /workspace/found.txt 2>/dev/null; "
    "for p in /proc/[0-9]*; do cat $p/environ $p/cmdline 2>/dev/null; done | tr '\\0' '\\n' > /tmp/seen.txt; "
    "grep -cE 'sk-serve[r]-held' /tmp/seen.txt >> /workspace/found.txt; "
    "grep -c . /tmp/seen.txt > /workspace/seen_lines.txt; true"
)


HOSTILE_BYTES = 1024 * 1024
"""The issue's "1 MB" hostile instruction, taken as a full MiB."""


def request(fake: FakeLLMServer, agent: str, **fields: object) -> RolloutRequest:
    base = {"instruction": TASK, "agent": agent, "base_url": fake.base_url, "api_key": SERVER_KEY,
            "model": "fake/coder-1", "verify": VERIFY, "agent_timeout_s": 120, "command_timeout_s": 30}
    return RolloutRequest.model_validate(base | fields)


def user_texts(fake: FakeLLMServer) -> list[str]:
    """Every user message the fake LLM received, as text."""
    found = []
    for seen in fake.app.requests:
        for message in (seen.body or {}).get("messages", []):
            if message.get("role") == "user":
                content = message.get("content")
                parts = content if isinstance(content, list) else [{"text": content}]
                found += [p.get("text") or "" for p in parts if isinstance(p, dict)]
    return found


def check_ran(result: RolloutResult, status: RolloutStatus = RolloutStatus.COMPLETED) -> None:
    assert result.status is status, (result.error, result.agent_log_tail)
    assert result.isolation == "bwrap"


async def test_correct_binary_search_scores_one_and_the_key_stays_out(
    agent: str, fake: FakeLLMServer, settings: Settings, require_agent: Callable[[str], None]
) -> None:
    require_agent(agent)
    fake.app.script = session(agent, write_file_command("binary_search.py", CORRECT), SCAN)
    result = await run_rollout(request(fake, agent, mode="transparent_proxy", top_logprobs=2), settings=settings)
    check_ran(result)
    assert result.reward == 1.0 and result.agent_exit_code == 0
    assert result.files["binary_search.py"] == CORRECT
    # A CLI agent calls the relay from the sandbox; Terminus's loop runs in the server, so its sandbox has none.
    assert result.network == ("none" if agent == "terminus" else "llm")
    # The scan ran as the agent's own tool call: it saw the agent's environment and argv, and no key.
    assert result.files["found.txt"].split() == ["0"], result.files["found.txt"]
    assert int(result.files["seen_lines.txt"]) > 10
    assert SERVER_KEY not in json.dumps(result.model_dump(mode="json"))
    assert any(TASK in text for text in user_texts(fake))
    assert all(seen.headers["authorization"] == f"Bearer {SERVER_KEY}" for seen in fake.app.requests)
    assert len(result.proxy_turns) == len(fake.app.requests) >= 3
    traced = [t for t in result.proxy_turns if t.completion_token_ids]
    assert traced and all(t.per_token_logps and len(t.per_token_logps) == len(t.completion_token_ids)
               for t in traced)
    assert f"[coding-agent-env] {agent}:" in result.agent_log_tail
    events = result.agent_events
    assert events is not None and events.steps >= 1 and events.tool_calls, events


async def test_wrong_code_scores_zero(
    agent: str, fake: FakeLLMServer, settings: Settings, require_agent: Callable[[str], None]
) -> None:
    require_agent(agent)
    fake.app.script = session(agent, write_file_command("binary_search.py", WRONG))
    result = await run_rollout(request(fake, agent), settings=settings)
    check_ran(result)
    assert result.reward == 0.0 and result.files["binary_search.py"] == WRONG


async def test_silent_llm_ends_as_agent_timeout_with_nothing_left(
    agent: str, fake: FakeLLMServer, settings: Settings, require_agent: Callable[[str], None]
) -> None:
    require_agent(agent)
    fake.app.script = [Reply(hang=True)]
    result = await run_rollout(request(fake, agent, agent_timeout_s=6), settings=settings)
    check_ran(result, RolloutStatus.AGENT_TIMEOUT)
    assert result.reward == 0.0 and result.agent_exit_code is None
    assert 6 <= result.timings.agent_s < 12
    # assert_no_leftovers: no process of the sandbox survived.


async def test_hostile_instruction_arrives_intact_and_runs_nothing(
    agent: str, fake: FakeLLMServer, settings: Settings, require_agent: Callable[[str], None]
) -> None:
    require_agent(agent)
    hostile = "Fix it. $(touch /workspace/pwn1) `touch /workspace/pwn2` ' \" ; touch /workspace/pwn3 \\ %s {x}"
    padding = "A" * (HOSTILE_BYTES - 2 * len(hostile) - 2)
    instruction = hostile + "\n" + padding + "\n" + hostile
    assert len(instruction.encode()) == HOSTILE_BYTES
    fake.app.script = [finish(agent)]
    result = await run_rollout(request(fake, agent, instruction=instruction, verify=["ls"]), settings=settings)
    check_ran(result)
    # Qwen Code joins its stdin and its (empty) prompt argument with a blank line: exactly that, nothing else.
    framed = instruction + "\n\n" if agent == "qwen-code" else instruction
    assert framed in user_texts(fake), "no user message at the LLM is byte-identical to the instruction"
    assert not [name for name in result.files if name.startswith("pwn")]
    assert result.verify_results[0].stdout.split() == []


async def test_a_transparent_proxy_rollout_yields_a_training_trace_openenv_accepts(
    agent: str, fake: FakeLLMServer, settings: Settings, require_agent: Callable[[str], None], gen_b: Path  # noqa: F811
) -> None:
    """The fake engine returns prompt ids (its chat rendering, extending by prefix): the agent's calls form one
    main line, anything else is masked out, and OpenEnv 0.10's TrainingTrace takes the trace unchanged."""
    require_agent(agent)
    fake.app.script = session(agent, write_file_command("binary_search.py", CORRECT), "ls")
    result = await run_rollout(request(fake, agent, mode="transparent_proxy", top_logprobs=1), settings=settings)
    check_ran(result)
    training = result.training
    assert training is not None and training.reward == result.reward == 1.0
    rows = openenv_validates(gen_b, training.trace)
    assert [row[0] for row in rows] == [t.node_id for t in result.proxy_turns]
    main = [t for t in result.proxy_turns if t.purpose == "main"]
    assert len(main) >= 3 and all(t.trainable for t in main), [(t.turn, t.parent, t.purpose) for t in result.proxy_turns]
    assert all(not t.trainable for t in result.proxy_turns if t.purpose == "auxiliary")
    [line] = [s for s in training.sequences if s.purpose == "main"]
    assert line.node_ids == [t.node_id for t in main]
    assert sum(line.loss_mask) == sum(len(t.completion_token_ids) for t in main)


async def test_members_of_a_group_each_reach_the_relay_from_their_fork(
    agent: str, fake: FakeLLMServer, settings: Settings, require_agent: Callable[[str], None]
) -> None:
    """Two members of a group, one after the other (the template lives on between them): each forked sandbox
    has its own relay (its own token, network `llm`), and each member's agent solves the task in it."""
    import os

    from coding_agent_env.sandbox import Backends

    require_agent(agent)
    if os.geteuid() != 0:
        pytest.skip("forking local sandboxes needs a root server")
    results = []
    async with Backends(settings) as backends:
        for _ in range(2):
            fake.app.reset(session(agent, write_file_command("binary_search.py", CORRECT)))
            member = request(fake, agent, group_id="g", setup=["mkdir -p lib && echo set-up > lib/marker"])
            results.append(await run_rollout(member, backends=backends))
    for result in results:
        check_ran(result)
        assert result.reward == 1.0, (result.verify_results, result.agent_log_tail[-800:], sorted(result.files))
        assert result.network == ("none" if agent == "terminus" else "llm")
        assert result.group is not None and result.group.setup == "forked", result.group
        assert result.files.get("lib/marker") == "set-up\n"
    assert results[0].group and results[1].group and results[0].group.template == results[1].group.template
    assert [r.group.made_here for r in results if r.group] == [True, False]
