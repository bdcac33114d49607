"""Interactive episodes end to end on real sandboxes: local bubblewrap and the real dockerd."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from coding_agent_env.cli.main import load_task
from coding_agent_env.episode import Episode, EpisodeDoneError, EpisodeStatus, parse_task
from coding_agent_env.models import RolloutRequest
from coding_agent_env.sandbox import Backends
from coding_agent_env.settings import Settings
from tests.backends.conftest import Target
from tests.backends.test_rollouts import SHADOW_UNITTEST
from tests.helpers import leftovers, poll

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "binary_search.yaml"
KINDS = ["local", "docker"]
EVERY_KIND = [*KINDS, "local-unisolated", "local-landlock", "hf", "e2b-fake"]

TASK = {
    "instruction": "Write the answer.",
    "files": {"notes/readme.txt": "hello"},
    "setup_scripts": "mkdir -p work && echo ready > work/flag",
    "verify_scripts": ["", 'test "$(cat "$FINAL_ANSWER_FILE")" = 42', "  ", "test -f work/flag"],
    "command_timeout_s": 20,
}


Starter = Callable[..., Awaitable[Episode]]


@pytest.fixture
async def start(assert_no_leftovers: None) -> AsyncIterator[Starter]:
    """`start(target, task, **kw)` -> a started episode; every one is closed before the leftovers are checked
    (also when the test failed half-way)."""
    made: list[Episode] = []

    async def starter(target: Target, task: dict[str, object] | RolloutRequest, **kw: object) -> Episode:
        request = task if isinstance(task, RolloutRequest) else parse_task({**task, "sandbox": target.name})
        made.append(await Episode.start(
            request, settings=target.settings, backends=target.backends, **kw  # type: ignore[arg-type]
        ))
        return made[-1]

    yield starter
    for episode in made:
        await episode.close()


@pytest.mark.parametrize("kind", EVERY_KIND)
async def test_a_full_episode(kind: str, backend_for: Callable[[str], Target], start: Starter) -> None:
    target = backend_for(kind)
    episode = await start(target, TASK, episode_id="ep-1")
    assert episode.status is EpisodeStatus.RUNNING and episode.id == "ep-1"
    report = episode.report()
    assert [r.cmd for r in report.setup_results] == ["mkdir -p work && echo ready > work/flag"]
    assert report.sandbox == target.name and report.isolation in ("bwrap", "landlock", "docker", "none", "e2b")
    # The persistent shell: cwd and exported variables carry over; a file written by setup is there.
    first = await episode.terminal("cd work && export GREETING='hi there'")
    assert (first.exit_code, first.timed_out) == (0, False)
    second = await episode.terminal('echo "$PWD|$GREETING|$(cat flag)|$(id -u)"; echo err >&2; exit 3')
    assert second.exit_code == 3
    where, greeting, flag, uid = second.output.splitlines()[0].split("|")
    assert where.endswith("/work") and (greeting, flag) == ("hi there", "ready")
    assert uid == "1000" or report.isolation in ("none", "landlock", "e2b")  # a namespace's user (in place: the host's)
    assert "err" in second.output
    assert (await episode.terminal("cat ../notes/readme.txt")).output == "hello"
    final = await episode.final_answer("42")
    assert final.status is EpisodeStatus.COMPLETED and final.done and final.reward == 1.0, final.error
    assert final.verify_context == "workspace" and [r.exit_code for r in final.verify_results] == [0, 0]
    assert final.step_count == 4 and [c.exit_code for c in final.commands] == [0, 3, 0]
    assert episode.sandbox is not None and episode.sandbox.closed
    with pytest.raises(EpisodeDoneError, match="completed"):
        await episode.terminal("true")


@pytest.mark.parametrize("kind", KINDS)
async def test_a_wrong_answer_scores_what_verify_says(kind: str, backend_for: Callable[[str], Target],
                                                     start: Starter) -> None:
    episode = await start(backend_for(kind), TASK)
    final = await episode.final_answer("41")
    assert final.status is EpisodeStatus.COMPLETED and final.reward == 0.5


@pytest.mark.parametrize("kind", KINDS)
async def test_setup_failure_ends_the_episode_with_real_results(kind: str, backend_for: Callable[[str], Target],
                                                               start: Starter) -> None:
    task = {**TASK, "setup_scripts": ["echo one", "echo broken >&2; exit 7", "echo never"]}
    episode = await start(backend_for(kind), task)
    report = episode.report()
    assert report.status is EpisodeStatus.SETUP_FAILED and report.done and report.reward is None
    assert [(r.cmd, r.exit_code) for r in report.setup_results] == [
        ("echo one", 0), ("echo broken >&2; exit 7", 7)]
    assert report.setup_results[1].stderr == "broken\n"
    assert report.error is not None and report.error.type == "SetupCommandFailed"
    assert episode.sandbox is not None and episode.sandbox.closed
    with pytest.raises(EpisodeDoneError, match="setup_failed"):
        await episode.terminal("true")


@pytest.mark.parametrize("kind", KINDS)
async def test_a_command_past_its_timeout_ends_its_foreground_job(kind: str, backend_for: Callable[[str], Target],
                                                                  start: Starter) -> None:
    """The live shell (attached on local, through init's control socket on Docker) interrupts the foreground job
    only: its background job lives on, as in a terminal, until the episode ends."""
    target = backend_for(kind)
    episode = await start(target, {**TASK, "command_timeout_s": 1})
    slow = await episode.terminal("echo started; sleep 60 & sleep 61")
    assert slow.timed_out and slow.exit_code is None and "started" in slow.output
    assert slow.note is not None and "interrupted (SIGINT)" in slow.note
    after = await episode.terminal("ps -eo args | grep '[s]leep 6' || true")
    assert episode.report().shell == "live"
    assert after.output.split() == ["sleep", "60"] and not after.timed_out
    await episode.close()
    assert episode.report().status is EpisodeStatus.CANCELLED


async def test_output_is_bounded_head_and_tail(backend_for: Callable[[str], Target],
                                               start: Starter) -> None:
    target = backend_for("local")
    episode = await start(target, TASK)
    cap = target.settings.episode_max_output_bytes
    out = await episode.terminal("echo HEAD; head -c 1000000 /dev/zero | tr '\\0' x; echo; echo TAIL")
    assert out.output.startswith("HEAD") and out.output.rstrip().endswith("TAIL")
    assert "bytes of output left out" in out.output and len(out.output) <= cap + 256
    await episode.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_a_background_writer_cannot_forge_the_reward(kind: str, backend_for: Callable[[str], Target],
                                                           start: Starter) -> None:
    """INTEGRITY 25: a process the agent left running would write reward 1 (and the answer) over and over; it
    is dead before verify clears the reward file, so the honest reward stands."""
    verify = ['test "$(cat "$FINAL_ANSWER_FILE")" = x', "false"]
    episode = await start(backend_for(kind), {**TASK, "verify_scripts": verify})
    assert episode.sandbox is not None
    logs = episode.sandbox.paths.logs
    planted = (f"nohup setsid bash -c 'while :; do mkdir -p {logs}/verifier; echo 1 > {logs}/verifier/reward.txt;"
               f" echo 1 > {logs}/final_answer.txt; sleep 0.01; done' >/dev/null 2>&1 & disown; echo ok;"
               f" until [ -s {logs}/verifier/reward.txt ]; do sleep 0.01; done; cat {logs}/verifier/reward.txt")
    assert (await episode.terminal(planted)).output == "ok\n1\n"  # the writer runs
    final = await episode.final_answer("x")
    assert final.reward == 0.5 and [r.exit_code for r in final.verify_results] == [0, 1]
    assert final.reward_note is None


@pytest.mark.parametrize("leave", ["set -m; ", "", "setsid "], ids=["job-control", "background", "setsid"])
async def test_a_background_writer_cannot_forge_the_reward_under_landlock(
    leave: str, backend_for: Callable[[str], Target], start: Starter
) -> None:
    """INTEGRITY 25 on the Landlock tier, where no PID namespace ends the shell's processes: a writer that tries
    to leave the process group the server kills (job control's setpgid, setsid: both refused there) or just
    runs in the background is dead before verify, so the honest reward stands."""
    verify = ['test "$(cat "$FINAL_ANSWER_FILE")" = x', "false"]
    episode = await start(backend_for("local-landlock"), {**TASK, "verify_scripts": verify})
    assert episode.sandbox is not None and episode.sandbox.isolation == "landlock"
    logs = episode.sandbox.paths.logs
    planted = (f"{leave}bash -c 'while :; do mkdir -p {logs}/verifier; echo 1 > {logs}/verifier/reward.txt;"
               f" echo 1 > {logs}/final_answer.txt; sleep 0.01; done' >/dev/null 2>&1 & echo ok")
    assert "ok" in (await episode.terminal(planted)).output  # the writer runs (job control says it cannot)
    final = await episode.final_answer("x")
    assert final.reward == 0.5 and [r.exit_code for r in final.verify_results] == [0, 1]


async def test_artifacts_verify_in_a_clean_room(backend_for: Callable[[str], Target],
                                                start: Starter) -> None:
    """The example task: the trainer's commands solve it, plant a `unittest` shadow and edit the test; the
    clean room holds only the artifact and the hidden tests."""
    task = load_task(str(EXAMPLE))
    request = parse_task({k: v for k, v in task.model_dump().items()
                          if k in ("instruction", "files", "setup", "verify", "verify_files", "artifacts", "task_id")})
    target = backend_for("local")
    episode = await start(target, request)
    await episode.terminal(SHADOW_UNITTEST)
    final = await episode.final_answer("done")
    assert final.verify_context == "clean_room" and final.reward == 0.0
    assert final.artifacts is not None and final.artifacts.copied == ["search.py"]
    solved = await start(target, request)
    for command in task.solution:
        assert (await solved.terminal(command)).exit_code == 0
    assert (await solved.final_answer("done")).reward == 1.0


async def test_idle_timeout_ends_the_episode(backend_for: Callable[..., Target], start: Starter) -> None:
    episode = await start(backend_for("local", episode_idle_timeout_s=1.5), TASK)  # seconds: a loaded machine pauses
    assert (await episode.terminal("true")).exit_code == 0
    await poll(lambda: episode.done and episode.sandbox is not None and episode.sandbox.closed)
    assert episode.report().status is EpisodeStatus.EXPIRED
    with pytest.raises(EpisodeDoneError, match="idle timeout"):
        await episode.terminal("true")


async def test_the_deadline_ends_a_command_and_the_episode(backend_for: Callable[..., Target],
                                                          start: Starter) -> None:
    episode = await start(backend_for("local", episode_timeout_s=3), TASK)
    with pytest.raises(EpisodeDoneError, match="deadline"):
        await episode.terminal("sleep 30")
    assert episode.report().status is EpisodeStatus.EXPIRED and episode.sandbox is not None and episode.sandbox.closed


async def test_close_during_a_command_kills_it(backend_for: Callable[[str], Target], start: Starter) -> None:
    episode = await start(backend_for("local"), TASK)
    running = asyncio.ensure_future(episode.terminal("sleep 30"))
    await poll(lambda: episode.busy)
    await episode.close()
    with pytest.raises(EpisodeDoneError, match="closed during the call"):
        await running
    assert episode.report().status is EpisodeStatus.CANCELLED


async def test_cancelled_start_leaves_nothing(backend_for: Callable[[str], Target], start: Starter) -> None:
    target = backend_for("local")
    starting = asyncio.ensure_future(start(target, {**TASK, "setup_scripts": "sleep 30"}))
    await poll(lambda: bool(target.settings.state_dir.exists() and any(target.settings.state_dir.iterdir())))
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting


async def test_a_hundred_episodes_ended_every_way_leave_nothing(settings: Settings) -> None:
    idle = settings.model_copy(update={"episode_idle_timeout_s": 0.2})
    async with Backends(idle) as backends:
        async def one(index: int) -> EpisodeStatus:
            episode = await Episode.start(parse_task(TASK), settings=idle, backends=backends)
            await episode.terminal("cd work; sleep 60 &")
            way = index % 4
            if way == 0:
                return (await episode.final_answer("42")).status
            if way == 1:
                await episode.close()
            elif way == 2:
                await poll(lambda: episode.done and episode.sandbox is not None and episode.sandbox.closed)
            else:
                call = asyncio.ensure_future(episode.terminal("sleep 60"))
                await poll(lambda: episode.busy)
                call.cancel()
                await asyncio.wait({call})
                await episode.close()
            return episode.report().status

        statuses = []
        for batch in range(10):
            statuses += await asyncio.gather(*(one(batch * 10 + i) for i in range(10)))
    assert statuses.count(EpisodeStatus.COMPLETED) == 25 and statuses.count(EpisodeStatus.EXPIRED) == 25
    assert statuses.count(EpisodeStatus.CANCELLED) == 50
    assert not leftovers(settings)


@pytest.mark.parametrize("kind", ["local", "local-unisolated"])
async def test_harbor_fields_reach_episodes(kind: str, backend_for: Callable[[str], Target], start: Starter) -> None:
    """A task field reaches episodes from the `Task` model: Harbor's hidden tests under /tests and its required
    reward file work in an episode as in a rollout, and a sandbox that cannot show /tests refuses the task at
    start (before any command), as a rollout's provision does."""
    task = {"instruction": "Write the answer.", "verify_files_root": "/tests", "reward_file_required": True,
            "verify_files": {"test.sh": 'test "$(cat "$FINAL_ANSWER_FILE")" = 42 && echo 1 > "$REWARD_FILE"'},
            "verify_scripts": "bash /tests/test.sh"}
    episode = await start(backend_for(kind), task)
    if kind == "local-unisolated":
        report = episode.report()
        assert report.status is EpisodeStatus.INFRA_ERROR and report.error is not None
        assert "/tests" in report.error.message and report.setup_results == []
        return
    assert (await episode.terminal("test -e /tests/test.sh; echo $?")).output == "1\n"  # hidden until verify
    final = await episode.final_answer("42")
    assert final.status is EpisodeStatus.COMPLETED and final.reward == 1.0, (final.error, final.verify_results)
    wrong = await start(backend_for(kind), task)
    assert (await wrong.final_answer("41")).reward == 0.0  # no reward file: 0, as Harbor's rule says
