"""Rollouts end to end on the real local sandbox, with the oracle and nop agents (no LLM needed)."""

from __future__ import annotations

import asyncio
import json
import resource
from pathlib import Path

import pytest
from pydantic import ValidationError

from coding_agent_env.agents import registry
from coding_agent_env.cli.main import load_task
from coding_agent_env.episode import Episode, parse_task
from coding_agent_env.errors import BackendRefusedError, UnknownAgentError, UnknownBackendError
from coding_agent_env.models import RolloutRequest, RolloutStatus
from coding_agent_env.rollout import events as ev
from coding_agent_env.rollout import run_rollout
from coding_agent_env.sandbox import Backends
from coding_agent_env.settings import Settings
from tests.helpers import with_local

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "binary_search.yaml"

pytestmark = pytest.mark.usefixtures("assert_no_leftovers")


def req(**fields: object) -> RolloutRequest:
    base: dict[str, object] = {"instruction": "do the task", "agent": "oracle", "command_timeout_s": 30}
    return RolloutRequest.model_validate(base | fields)


async def test_oracle_passes_binary_search(settings: Settings) -> None:
    seen: list[ev.RolloutEvent] = []
    result = await run_rollout(load_task(str(EXAMPLE)), settings=settings, emit=seen.append)
    assert result.status is RolloutStatus.COMPLETED and result.reward == 1.0
    assert result.agent_exit_code == 0 and result.task_id == "binary_search"
    assert [r.exit_code for r in result.setup_results] == [0] and [r.exit_code for r in result.verify_results] == [0]
    assert "def binary_search" in result.files["search.py"] and "NotImplementedError" not in result.files["search.py"]
    assert result.isolation in ("bwrap", "none") and result.sandbox == "local"
    assert result.timings.total_s >= result.timings.agent_s > 0
    kinds = [e.type for e in seen]
    assert kinds[0] == "rollout_started" and kinds[-1] == "rollout_finished" and "provisioned" in kinds
    phases = [e.phase for e in seen if isinstance(e, ev.PhaseStarted)]
    assert phases == ["provision", "setup", "agent", "verify", "collect", "teardown"]


async def test_without_isolation_nothing_runs_unless_the_operator_opts_in(
    settings: Settings, assert_no_leftovers: None
) -> None:
    """Fail closed: where the isolation asked for cannot run, a rollout is refused before anything is made,
    naming the setting; where bubblewrap cannot run but Landlock can, the Landlock tier runs it (and says so),
    whatever SANDBOX_ALLOW_UNISOLATED says. (Where no tier works the refusal names the fixes:
    tests/unit/test_landlock.py; this kernel always has Landlock.)"""
    required = with_local(settings, bwrap_path="/bin/false", isolation="bwrap")  # a bubblewrap that cannot run
    with pytest.raises(BackendRefusedError, match=r"LOCAL_ISOLATION=bwrap"):
        await run_rollout(load_task(str(EXAMPLE)), settings=required)
    assert not required.state_dir.exists() or not any(required.state_dir.iterdir())
    async with Backends(required) as backends:
        status = backends.get("local").check()
        assert not status.available and "LOCAL_ISOLATION=bwrap" in status.detail
        task = parse_task({"instruction": "x"})
        with pytest.raises(BackendRefusedError):
            await Episode.start(task, settings=required, backends=backends)
    for allow in (False, True):
        fallback = with_local(settings, bwrap_path="/bin/false", allow_unisolated=allow)
        result = await run_rollout(load_task(str(EXAMPLE)), settings=fallback)
        assert (result.isolation, result.network, result.reward) == ("landlock", "none", 1.0)
    assert Settings.from_env({"SANDBOX_ALLOW_UNISOLATED": "true"}).backend_config("local").allow_unisolated


async def test_nop_gets_zero(settings: Settings) -> None:
    task = load_task(str(EXAMPLE)).model_copy(update={"agent": "nop"})
    result = await run_rollout(task, settings=settings)
    assert result.status is RolloutStatus.COMPLETED and result.reward == 0.0


@pytest.mark.parametrize("size", [10, 130_000], ids=["short", "near-the-limit"])
async def test_oracle_runs_one_solution_command_of_any_allowed_size(settings: Settings, size: int) -> None:
    """One solution command runs as its own `bash -c`, up to the longest command a request may hold (one argv
    string, which the kernel caps at 128 KiB); a longer one is refused by the request itself."""
    text = "x" * size
    result = await run_rollout(req(solution=[f"cat > big <<'EOF'\n{text}\nEOF"], verify=[f"test $(wc -c < big) = {size + 1}"]),
                               settings=settings)
    assert result.status is RolloutStatus.COMPLETED and result.reward == 1.0, (result.error, result.agent_log_tail)
    with pytest.raises(ValidationError, match="bytes"):
        req(solution=["é" * 70_000])  # 140,000 bytes in UTF-8


async def test_half_passing_verify_gives_half(settings: Settings) -> None:
    result = await run_rollout(req(solution=["echo a > a"], verify=["test -f a", "test -f b"]), settings=settings)
    assert result.reward == 0.5 and [r.ok for r in result.verify_results] == [True, False]


async def test_setup_failure_stops_the_rollout(settings: Settings) -> None:
    result = await run_rollout(
        req(setup=["echo one", "echo two >&2; exit 3", "echo three > three"], solution=["touch ran"], verify=["true"]),
        settings=settings,
    )
    assert result.status is RolloutStatus.SETUP_FAILED and result.reward is None
    assert [r.exit_code for r in result.setup_results] == [0, 3]
    assert result.setup_results[1].stderr == "two\n" and result.setup_results[0].stdout == "one\n"
    assert result.verify_results == [] and result.agent_exit_code is None
    assert result.error_detail is not None and result.error_detail.stage == "setup"


async def test_setup_command_that_never_exits_times_out(settings: Settings) -> None:
    result = await run_rollout(req(setup=["sleep 1000"], command_timeout_s=0.5, verify=["true"]), settings=settings)
    assert result.status is RolloutStatus.SETUP_FAILED and result.setup_results[0].timed_out


async def test_agent_timeout_kills_the_whole_tree_before_verify(settings: Settings) -> None:
    ticker = "(trap '' TERM HUP; while true; do echo t >> tick; sleep 0.02; done) & sleep 1000"
    verify = "a=$(wc -c < tick); sleep 0.3; b=$(wc -c < tick); test \"$a\" = \"$b\""
    result = await run_rollout(req(solution=[ticker], verify=[verify], agent_timeout_s=1.0), settings=settings)
    assert result.status is RolloutStatus.AGENT_TIMEOUT
    assert result.reward == 1.0, "the ticker was still writing during verify"
    assert 1.0 <= result.timings.agent_s < 5


async def test_agent_failure_is_the_agents_outcome_and_still_verified(settings: Settings) -> None:
    result = await run_rollout(req(solution=["touch done", "exit 4", "touch never"], verify=["test -f done", "test -f never"]), settings=settings)
    assert result.status is RolloutStatus.AGENT_FAILED and result.agent_exit_code == 4 and result.reward == 0.5


@pytest.mark.parametrize("forged", ["1.0", "nan", "7", "one", "-0.5", "inf", "1e309"])
async def test_agent_cannot_forge_the_reward(settings: Settings, forged: str) -> None:
    planted = [
        f"mkdir -p /logs/verifier && echo {forged} > /logs/verifier/reward.txt",
        f"mkdir -p fake && echo {forged} > fake/reward.txt",
        f"echo {forged} > \"$HOME/reward.txt\"",
    ]
    result = await run_rollout(req(solution=planted, verify=["false"]), settings=settings)
    assert result.reward == 0.0


async def test_verifier_dir_swapped_for_a_symlink_is_replaced(settings: Settings) -> None:
    planted = "mkdir -p fake && echo 1.0 > fake/reward.txt && rm -rf /logs/verifier && ln -s /workspace/fake /logs/verifier"
    result = await run_rollout(req(solution=[planted], verify=["false"]), settings=settings)
    assert result.reward == 0.0


@pytest.mark.parametrize(("written", "reward", "note"), [("0.25", 0.25, None), ("nan", 1.0, "not finite"), ("7", 1.0, "out of [0, 1]"), ("text", 1.0, "not a number")])
async def test_reward_file_from_verify(settings: Settings, written: str, reward: float, note: str | None) -> None:
    result = await run_rollout(req(verify=[f"echo {written} > \"$REWARD_FILE\""]), settings=settings)
    assert result.reward == reward
    assert (note is None and result.reward_note is None) or (note is not None and note in (result.reward_note or ""))


async def test_planted_interpreters_are_not_used_by_verify(settings: Settings) -> None:
    fake = "#!/bin/sh\\nexit 0\\n"
    planted = [
        f"for d in \"$HOME/.local/bin\" \"$HOME/bin\" /tmp /workspace; do mkdir -p $d; printf '{fake}' > $d/python3; chmod +x $d/python3; cp $d/python3 $d/test; done",
        "mkdir -p \"$HOME/.local/lib/python3.11/site-packages\" && echo 'import os; os._exit(0)' > \"$HOME/.local/lib/python3.11/site-packages/usercustomize.py\"",
        "echo 'python3() { return 0; }' > \"$HOME/.bashrc\"; cp \"$HOME/.bashrc\" \"$HOME/.profile\"",
    ]
    verify = ["python3 -c 'import sys; sys.exit(1)'", "test 1 = 2"]
    result = await run_rollout(req(solution=planted, verify=verify), settings=settings)
    assert result.agent_exit_code == 0 and result.reward == 0.0


async def test_hostile_strings_do_not_inject(settings: Settings) -> None:
    hostile = "x'\"$(touch /workspace/pwned1)`touch /workspace/pwned2`; touch /workspace/pwned3 #"
    request = req(
        instruction=hostile * 3,
        task_id=hostile,
        files={f"dir with space/{hostile.replace('/', '_')}.txt": hostile},
        solution=[f"printf '%s' {_sh_quote(hostile)} > out.txt"],
        verify=["test ! -e pwned1 && test ! -e pwned2 && test ! -e pwned3"],
        base_url="http://127.0.0.1:9/v1",
        api_key="sk-x '$(touch /workspace/pwned4)'",
        model="m'; touch /workspace/pwned5; '",
    )
    result = await run_rollout(request, settings=settings)
    assert result.reward == 1.0 and result.task_id == hostile
    assert result.files["out.txt"] == hostile
    assert not [path for path in result.files if "pwned" in path.split("/")[-1][:6]]
    assert "sk-x" not in result.model_dump_json()


async def test_a_secret_in_command_output_is_redacted_in_the_events_too(settings: Settings) -> None:
    """The task-command runner redacts what setup and verify print before it is emitted, not only the result."""
    key = "sk-caller-held-SECRET-42"
    printed = f"printf '%s%s\\n' {key[:9]} {key[9:]}"  # printed whole, though never written whole in the command
    seen: list[ev.RolloutEvent] = []
    request = req(setup=[printed], verify=[printed], base_url="http://127.0.0.1:9/v1", api_key=key, model="m")
    result = await run_rollout(request, settings=settings, emit=seen.append)
    assert result.reward == 1.0
    outputs = [e.result.stdout for e in seen if isinstance(e, ev.CommandFinished)]
    assert outputs == ["[REDACTED]\n", "[REDACTED]\n"]
    assert key not in result.model_dump_json()


def _sh_quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


async def test_symlinks_out_of_the_workdir_are_not_collected(settings: Settings) -> None:
    result = await run_rollout(req(solution=["ln -s /etc/passwd leak", "ln -s ../../../../../etc/passwd leak2", "echo ok > real.txt"]), settings=settings)
    assert result.files == {"real.txt": "ok\n"}
    assert set(result.files_extra) >= {"leak", "leak2"}
    assert "root:" not in result.model_dump_json()


async def test_undecodable_file_names_still_give_a_sendable_result(settings: Settings) -> None:
    """A file name that is not UTF-8 comes back as surrogate escapes, which no JSON encoder takes."""
    solution = ["printf '\\377' > \"$(printf 'bad\\377name')\""]  # not UTF-8 either: omitted, by name
    result = await run_rollout(req(solution=solution, verify=["true"]), settings=settings)
    assert result.reward == 1.0, result.verify_results
    assert json.loads(result.model_dump_json())["files_extra"] == ["bad?name"]


async def test_non_utf8_output_and_huge_stdout_are_bounded(settings: Settings) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = await run_rollout(
        req(setup=["printf '\\377\\376ok'", "head -c 100000000 /dev/zero | tr '\\0' x"], verify=["true"]), settings=settings
    )
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert result.setup_results[0].stdout == "\ufffd\ufffdok"
    big = result.setup_results[1].stdout
    assert big.startswith("x" * 1000) and len(big) < settings.max_output_bytes + 100 and "more bytes dropped" in big
    assert grown_kib < 50 * 1024, f"the server grew by {grown_kib} KiB reading 100 MB of output"


async def test_fork_bomb_in_the_agent_is_contained(settings: Settings) -> None:
    tight = settings.model_copy(update={"sandbox_max_processes": 64})
    result = await run_rollout(req(solution=["bomb() { bomb | bomb & }; bomb; sleep 2"], verify=["echo verify-ran"], agent_timeout_s=20), settings=tight)
    assert result.status in (RolloutStatus.COMPLETED, RolloutStatus.AGENT_FAILED, RolloutStatus.AGENT_TIMEOUT)
    assert result.verify_results[0].stdout == "verify-ran\n"


def test_bad_requests_are_refused_before_anything_starts(settings: Settings) -> None:
    for bad in ({"instruction": ""}, {"instruction": "   "}, {"instruction": "x", "agent": "sudo"},
                {"instruction": "x", "files": {"../evil": "x"}}, {"instruction": "x", "files": {"/etc/evil": "x"}},
                {"instruction": "x", "files": {"a/../../evil": "x"}}, {"instruction": "x", "base_url": "http://x"}):
        with pytest.raises(ValidationError):
            RolloutRequest.model_validate(bad)


async def test_unavailable_agent_and_backend_are_request_errors(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(registry.AGENTS, "opencode", raising=False)  # as on a server that does not offer it
    with pytest.raises(UnknownAgentError, match="not available"):
        await run_rollout(req(agent="opencode"), settings=settings)
    with pytest.raises(UnknownBackendError, match="not enabled"):
        await run_rollout(req(sandbox="docker"), settings=settings)


async def test_cancel_event_returns_a_cancelled_result(settings: Settings) -> None:
    cancel = asyncio.Event()

    def on_event(event: ev.RolloutEvent) -> None:
        if isinstance(event, ev.PhaseStarted) and event.phase == "agent":
            asyncio.get_running_loop().call_later(0.2, cancel.set)

    result = await run_rollout(req(solution=["sleep 1000"], verify=["true"]), settings=settings, emit=on_event, cancel=cancel)
    assert result.status is RolloutStatus.CANCELLED and result.reward is None
    assert result.timings.teardown_s > 0


async def test_task_cancellation_tears_down_and_propagates(settings: Settings) -> None:
    started = asyncio.Event()

    def on_event(event: ev.RolloutEvent) -> None:
        if isinstance(event, ev.PhaseStarted) and event.phase == "agent":
            started.set()

    task = asyncio.ensure_future(run_rollout(req(solution=["sleep 1000"]), settings=settings, emit=on_event))
    await asyncio.wait_for(started.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.parametrize(("solution", "code"), [([], 0), (["exit 6"], 6), (["true", "exit 7"], 7), (["exit 8", "true"], 8)])
async def test_oracle_exit_code_is_the_failing_commands(settings: Settings, solution: list[str], code: int) -> None:
    result = await run_rollout(req(solution=solution, verify=["true"]), settings=settings)
    assert result.agent_exit_code == code
