"""The Interactive tab's logic without a browser: UiEpisodes shares the capacity, keeps a transcript, gives its
slot back when the episode ends, and Cancel tears it down."""

from __future__ import annotations

import pytest

from coding_agent_env.api.ui.episodes import UiEpisodes
from coding_agent_env.api.ui.interactive_tab import report_html
from coding_agent_env.api.ui.presets import PRESETS
from coding_agent_env.episode import EpisodeDoneError, TerminalArgumentsError
from coding_agent_env.episode.task import TASK_FIELDS
from coding_agent_env.session import CapacityError, NoEpisodeError, SessionKind, SessionManager
from coding_agent_env.settings import Settings
from tests.helpers import leftovers

def preset_task(name: str) -> dict[str, object]:
    return PRESETS[name].task_fields(TASK_FIELDS)  # as the Interactive tab starts it


async def test_an_episode_from_the_tab(settings: Settings, assert_no_leftovers: None) -> None:
    manager = SessionManager(settings.model_copy(update={"max_concurrent_envs": 1}))
    episodes = UiEpisodes(manager)
    held = manager.create(SessionKind.WS)
    with pytest.raises(CapacityError):
        await episodes.start("b", preset_task("fizzbuzz"))
    await manager.close(held.id)
    with pytest.raises(NoEpisodeError):
        await episodes.run("b", "ls")
    view = await episodes.start("b", preset_task("fizzbuzz"))
    assert manager.active == 1 and "episode running" in view.text()
    assert "Episode running" in report_html(view.report())
    with pytest.raises(TerminalArgumentsError):
        await episodes.run("b", "")
    for command in PRESETS["fizzbuzz"].solution:
        assert (await episodes.run("b", command)).exit_code == 0
    out = await episodes.run("b", "python3 fizzbuzz.py | head -3; exit 2")
    assert out.output == "1\n2\nFizz\n" and out.exit_code == 2
    # `exit` ends the live shell: a new one takes over, and the transcript says so
    assert "$ python3 fizzbuzz.py | head -3; exit 2\n1\n2\nFizz\n[exit code 2; the shell exited" in view.text()
    report = await episodes.answer("b", "done")
    assert report.reward == 1.0 and report.verify_context == "clean_room"
    assert manager.active == 0  # the slot is given back; the report and transcript stay
    html = report_html(view.report())
    assert 'data-verdict="PASS"' in html and "reward <b>1</b>" in html and "clean room" in html
    assert "reward 1]" in view.text()
    with pytest.raises(EpisodeDoneError, match="completed"):
        await episodes.run("b", "ls")
    assert await episodes.cancel("b") and not await episodes.cancel("b")
    await manager.stop()


async def test_cancel_and_shutdown_tear_episodes_down(settings: Settings) -> None:
    manager = SessionManager(settings)
    episodes = UiEpisodes(manager)
    await episodes.start("one", preset_task("binary_search"))
    await episodes.start("two", preset_task("fizzbuzz"))
    failed = await episodes.start("three", {**preset_task("fizzbuzz"), "setup": ["exit 3"]})
    assert failed.report() is not None and failed.report().status.value == "setup_failed"
    assert manager.active == 2 and "[exit code 3]" in failed.text()
    assert await episodes.cancel("one")
    assert manager.active == 1
    await episodes.stop()
    assert manager.active == 0 and not leftovers(settings)
    await manager.stop()
