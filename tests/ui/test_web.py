"""The /web tab in a real browser: presets run with the oracle agent, a failing task, capacity, cancel.

One live server (MAX_CONCURRENT_ENVS=2) and one Chromium for the module; each test gets its own page.
Set UI_SCREENSHOT=docs/web-ui.png to refresh the screenshot in the README and docs/tutorials/first-rollout.md of the result view.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect

from coding_agent_env.api.ui.presets import PRESETS
from coding_agent_env.settings import Settings
from tests.helpers import sandbox_dirs, wait_until
from tests.ui.conftest import UiServer

pytestmark = pytest.mark.ui

SECRET = "sk-uitest-NEVER-SHOWN-7731"
SLEEP_MARK = "3117.25"


def _open(page, server: UiServer) -> None:  # noqa: ANN001
    page.goto(server.url + "/")
    assert page.url == server.url + "/web/"
    page.locator("#run").wait_for()


def _pick(page, elem_id: str, value: str) -> None:  # noqa: ANN001
    page.locator(f"#{elem_id} input").click()
    page.get_by_role("option", name=value, exact=False).first.click()


def _run(page) -> str:  # noqa: ANN001
    """Click Run and return the verdict shown by the result badge."""
    page.locator("#run").click()
    badge = page.locator("#notice .cae-result")
    badge.wait_for()
    return badge.get_attribute("data-verdict") or ""


def _processes_with(marker: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if marker in cmdline:
                found.append(f"{entry.name}: {cmdline[:120]}")
    return found


def test_preset_passes_with_the_oracle(page, ui_server: UiServer, tmp_path: Path) -> None:  # noqa: ANN001
    _open(page, ui_server)
    _pick(page, "preset", "fizzbuzz")
    expect(page.locator("#instruction textarea")).to_have_value(re.compile("FizzBuzz"))
    page.get_by_text("LLM endpoint").click()
    page.locator("#api-key input").fill(SECRET)  # never needed by the oracle; must never come back
    assert _run(page) == "PASS"
    notice = page.locator("#notice").inner_text()
    assert "reward 1" in notice and "status completed" in notice and "isolation" in notice
    assert "verify in a clean room" in notice  # the preset declares its artifact
    expect(page.locator("#log textarea")).to_have_value(re.compile(r"finished: completed, reward 1\.0"))
    page.get_by_role("tab", name="Files").click()
    assert "fizzbuzz.py" in page.locator("#files-view").inner_text()
    page.screenshot(path=os.environ.get("UI_SCREENSHOT") or str(tmp_path / "web-ui.png"), full_page=True)
    assert SECRET not in page.content()
    assert SECRET not in ui_server.log_path.read_text(errors="replace")


def test_a_task_of_the_servers_task_set_runs_from_the_tab(page, ui_server: UiServer) -> None:  # noqa: ANN001
    """`serve --tasks` (TASKS): the tab offers each task as `<split>/<id>` and runs it as the set holds it (a Harbor
    task: its workdir, users and tests), here with its own solution by the oracle."""
    _open(page, ui_server)
    _pick(page, "preset", "train/hello-file")
    expect(page.locator("#instruction textarea")).to_have_value(re.compile("hello.txt"))
    assert _run(page) == "PASS"
    assert "reward 1" in page.locator("#notice").inner_text()


def test_failing_preset_shows_fail(page, ui_server: UiServer) -> None:  # noqa: ANN001
    _open(page, ui_server)
    _pick(page, "preset", "failing")
    expect(page.locator("#instruction textarea")).to_have_value(re.compile("number 42"))
    assert _run(page) == "FAIL"
    assert "reward 0" in page.locator("#notice").inner_text()


def test_full_capacity_shows_the_message(page, ui_server: UiServer) -> None:  # noqa: ANN001
    held = [ui_server.rpc("openenv/session/create")["result"]["session_id"] for _ in range(2)]
    try:
        _open(page, ui_server)
        page.locator("#run").click()
        page.get_by_text("Server at capacity: 2/2 sessions active").wait_for()
    finally:
        for session_id in held:
            ui_server.rpc("openenv/session/close", session_id=session_id)
    assert _run(page) == "PASS"  # the slots are free again; the UI session took one and gave it back


def test_cancel_tears_the_rollout_down(page, ui_server: UiServer) -> None:  # noqa: ANN001
    _open(page, ui_server)
    editor = page.locator("#solution .cm-content")
    editor.click()
    page.keyboard.press("Control+A")
    page.keyboard.type(f"- sleep {SLEEP_MARK}")
    page.locator("#run").click()
    expect(page.locator("#log textarea")).to_have_value(re.compile(r"agent \.\.\."))
    wait_until(lambda: bool(_processes_with(SLEEP_MARK)), "the agent's sleep to start", timeout_s=30)
    page.locator("#cancel").click()
    badge = page.locator("#notice .cae-result")
    badge.wait_for()
    assert "status cancelled" in badge.inner_text()
    assert _processes_with(SLEEP_MARK) == []


def test_opencode_preset_through_a_custom_endpoint(page, ui_server: UiServer) -> None:  # noqa: ANN001
    """OpenCode against the scripted fake LLM, reached through the form's custom base_url/api_key/model."""
    from coding_agent_env.agents.registry import available_agents
    from tests.fakes.llm import FakeLLM, FakeLLMServer, Reply

    if "opencode" not in available_agents():
        pytest.skip("the opencode agent is not registered on this server yet")
    solution = PRESETS["fizzbuzz"].solution[0]
    script = [
        Reply(content=None, tool_calls=(("bash", json.dumps({"command": solution, "description": "write it"})),)),
        Reply(content="Done."),
    ]
    with FakeLLMServer(FakeLLM(script=script, api_key="sk-fake-ui")) as llm:
        _open(page, ui_server)
        _pick(page, "preset", "fizzbuzz")
        expect(page.locator("#instruction textarea")).to_have_value(re.compile("FizzBuzz"))
        _pick(page, "agent", "opencode")
        page.get_by_text("LLM endpoint").click()
        _pick(page, "endpoint", "custom")
        page.locator("#model textarea").fill("fake-model")
        page.locator("#base-url textarea").fill(llm.base_url)
        page.locator("#api-key input").fill("sk-fake-ui")
        assert _run(page) == "PASS"
        assert llm.app.requests, "the fake LLM saw no call"
    page.get_by_role("tab", name="Files").click()
    assert "fizzbuzz.py" in page.locator("#files-view").inner_text()
    page.get_by_role("tab", name="Turns").click()
    turns = re.search(r"(\d+) turns · prompt tokens (\d+)", page.locator("#turns-view").inner_text())
    assert turns is not None and int(turns[1]) >= 2 and int(turns[2]) > 0, "the relay recorded no turns"


def test_interactive_episode(page, ui_server: UiServer) -> None:  # noqa: ANN001
    """The Interactive tab: start fizzbuzz, type the solution, answer, see PASS; then Cancel tears a second
    episode down (its sleeping command included)."""
    _open(page, ui_server)
    page.get_by_role("tab", name="Interactive").click()
    _pick(page, "ep-preset", "fizzbuzz")
    expect(page.locator("#ep-instruction textarea")).to_have_value(re.compile("FizzBuzz"))
    page.locator("#ep-start").click()
    expect(page.locator("#ep-status")).to_contain_text("Episode running")
    command = page.locator("#ep-command textarea")
    command.fill(PRESETS["fizzbuzz"].solution[0])
    page.locator("#ep-run").click()
    expect(page.locator("#ep-transcript textarea")).to_have_value(re.compile(r"\[exit code 0\]"))
    command.fill("python3 fizzbuzz.py | sed -n 15p")
    command.press("Enter")
    expect(page.locator("#ep-transcript textarea")).to_have_value(re.compile(r"sed -n 15p\nFizzBuzz\n\[exit code 0\]"))
    page.locator("#ep-answer textarea").fill("done")
    page.locator("#ep-submit").click()
    badge = page.locator("#ep-status .cae-result")
    badge.wait_for()
    assert badge.get_attribute("data-verdict") == "PASS" and "reward 1" in badge.inner_text()
    command.fill("ls")
    page.locator("#ep-run").click()
    expect(page.locator("#ep-status")).to_contain_text("has ended (completed)")
    # A second episode, cancelled while a command sleeps.
    page.locator("#ep-start").click()
    expect(page.locator("#ep-status")).to_contain_text("Episode running")
    command.fill(f"sleep {SLEEP_MARK}")
    page.locator("#ep-run").click()
    wait_until(lambda: bool(_processes_with(SLEEP_MARK)), "the command's sleep to start", timeout_s=30)
    page.locator("#ep-cancel").click()
    expect(page.locator("#ep-status")).to_contain_text("cancelled")
    wait_until(lambda: not _processes_with(SLEEP_MARK), "the sleep to be killed", timeout_s=30)
    # Sandboxes only: the live server's own relay sockets stay while it serves.
    left = lambda: [d for d in sandbox_dirs(Settings(state_dir=ui_server.state_dir))  # noqa: E731
                    if not d.startswith("relay/")]
    wait_until(lambda: not left(), lambda: f"the sandbox removed: {left()}",
               timeout_s=30)


def test_server_view_shows_the_metrics(page, ui_server: UiServer) -> None:  # noqa: ANN001
    """The Server tab: the same figures `/metrics` serves (rollouts finished here equal the scrape's total), and
    its charts drawn."""
    from prometheus_client.parser import text_string_to_metric_families

    _open(page, ui_server)
    page.get_by_role("tab", name="Server").click()
    scraped = httpx.get(ui_server.url + "/metrics", timeout=10).text
    finished = sum(sample.value for family in text_string_to_metric_families(scraped)
                   for sample in family.samples if sample.name == "coding_agent_env_rollouts_finished_total")
    figures = page.locator("#server-figures")
    expect(figures).to_contain_text(re.compile(rf"rollouts finished\s*{finished:g}\b"))
    expect(figures).to_contain_text("sessions live")
    expect(page.locator("#server-chart-phases canvas, #server-chart-phases svg").first).to_be_visible()
