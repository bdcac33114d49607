"""The web tab's logic without a browser: form -> request, result -> badge and tables, UiRuns and capacity."""

from __future__ import annotations

import dataclasses

import pytest

from coding_agent_env.api.ui import render
from coding_agent_env.api.ui.form import (
    CUSTOM_ENDPOINT,
    DEFAULT_ENDPOINT,
    Form,
    FormError,
    agent_choices,
    build_request,
    endpoint_choices,
    preset_texts,
)
from coding_agent_env.api.ui.presets import PRESETS, Preset
from coding_agent_env.api.ui.rollouts import UiRuns
from coding_agent_env.models import (
    AGENT_NAMES,
    ArtifactReport,
    CommandResult,
    ErrorInfo,
    RolloutResult,
    RolloutStatus,
    Task,
)
from coding_agent_env.rollout import events as ev
from coding_agent_env.session import CapacityError, SessionKind, SessionManager
from coding_agent_env.sandbox import Backends
from coding_agent_env.settings import Settings
from tests.helpers import with_local

SECRET = "sk-form-SECRET-'$(touch /tmp/pwn)'"


def _form(preset: str = "binary_search", **changes: object) -> Form:
    form = Form(**preset_texts(PRESETS[preset]), agent="oracle", sandbox=None, endpoint=DEFAULT_ENDPOINT)
    return dataclasses.replace(form, **changes)


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_round_trip_through_the_editors(name: str) -> None:
    request = build_request(_form(name))
    preset = PRESETS[name]
    assert (request.files, request.setup, request.verify, request.solution) == (
        preset.files, preset.setup, preset.verify, preset.solution
    )
    assert (request.verify_files, request.artifacts) == (preset.verify_files, preset.artifacts)
    assert request.artifacts, "every preset verifies in a clean room"
    assert request.endpoint is None and request.api_key is None and request.agent == "oracle"


def test_a_preset_is_a_task_and_its_other_task_fields_reach_the_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """The editors hold the fields they show; a task field without an editor (here `env`) comes from the
    selected preset itself, and the preset's name and description are no task fields."""
    assert all(isinstance(preset, Task) and "name" not in preset.task_fields() for preset in PRESETS.values())
    monkeypatch.setitem(PRESETS, "with_env", Preset(name="with_env", instruction="x", env={"GREETING": "hi"}))
    form = Form(**preset_texts(PRESETS["with_env"]), agent="oracle", sandbox=None, endpoint=DEFAULT_ENDPOINT)
    assert build_request(form).env == {}
    assert build_request(dataclasses.replace(form, preset="with_env")).env == {"GREETING": "hi"}
    assert build_request(dataclasses.replace(form, preset="with_env", instruction="edited")).instruction == "edited"


def test_the_form_is_validated_by_the_run_rollout_tool_itself() -> None:
    """As on every door: a file text no file can hold (a lone surrogate) is refused before anything runs."""
    with pytest.raises(FormError, match=r"files\['a\.txt'\].*U\+D800") as caught:
        build_request(_form(files='a.txt: "SECRET\\ud800"'))
    assert "SECRET" not in str(caught.value)


def test_empty_boxes_fall_back_to_the_request_defaults() -> None:
    request = build_request(_form(files=None, setup=None, task_id=None, model=None, agent_timeout_s=None,
                                  command_timeout_s=None, top_logprobs=None))
    assert request.files == {} and request.setup == [] and request.agent_timeout_s == 600.0


def test_form_errors_never_quote_the_values() -> None:
    with pytest.raises(FormError) as bad_yaml:
        build_request(_form(setup=f"- [{SECRET}"))
    with pytest.raises(FormError) as no_url:
        build_request(_form(endpoint=CUSTOM_ENDPOINT, api_key=SECRET, model="m"))
    with pytest.raises(FormError) as bad_number:
        build_request(_form(agent_timeout_s=-1.0, api_key=SECRET, endpoint="openai"))
    with pytest.raises(FormError, match=r"artifacts: expected a YAML list of workdir-relative paths or globs"):
        build_request(_form(artifacts="a: b"))
    with pytest.raises(FormError, match=r"verify_files: expected a YAML mapping"):
        build_request(_form(verify_files="- x"))
    with pytest.raises(FormError, match=r"^artifacts: .*artifact '\.\./outside\.py' contains '\.\.'"):
        build_request(_form(artifacts="- ../outside.py"))
    for err in (bad_yaml, no_url, bad_number):
        assert SECRET not in str(err.value) and "touch" not in str(err.value)
    assert "setup" in str(bad_yaml.value) and "agent_timeout_s" in str(bad_number.value)


async def test_isolation_off_shows_a_warning_banner(settings: Settings) -> None:
    from coding_agent_env.api.ui.tab import isolation_warning

    async with Backends(with_local(settings, isolation="none")) as off, Backends(settings) as on:
        warning = isolation_warning(off)
        assert warning is not None and warning.startswith("Isolation is off on local")
        assert isolation_warning(on) is None


def test_key_travels_only_as_a_secret() -> None:
    custom = _form(endpoint=CUSTOM_ENDPOINT, base_url="http://127.0.0.1:9/v1", api_key=SECRET, model="m")
    request = build_request(custom)
    assert request.api_key is not None and request.api_key.get_secret_value() == SECRET
    assert SECRET not in repr(request) and SECRET not in request.model_dump_json()
    # a catalog endpoint takes the key; the server default does not (the key would have nowhere to go)
    assert build_request(_form(endpoint="openai", api_key=SECRET)).api_key is not None
    assert build_request(_form(api_key=SECRET)).api_key is None


def test_selector_choices() -> None:
    agents = dict((value, label) for label, value in agent_choices(Settings()))
    assert list(agents) == list(AGENT_NAMES)
    assert agents["oracle"] == "oracle (installed)"
    endpoints = [value for _, value in endpoint_choices(Settings())]
    assert endpoints[0] == DEFAULT_ENDPOINT and endpoints[-1] == CUSTOM_ENDPOINT and "openai" in endpoints


def _result(status: RolloutStatus, reward: float | None, **fields: object) -> RolloutResult:
    return RolloutResult(rollout_id="r1", agent="oracle", sandbox="local", status=status, reward=reward, **fields)


def test_verdicts_and_badge() -> None:
    assert render.verdict(_result(RolloutStatus.COMPLETED, 1.0)) == "PASS"
    assert render.verdict(_result(RolloutStatus.AGENT_FAILED, 0.5)) == "PARTIAL"
    assert render.verdict(_result(RolloutStatus.COMPLETED, 0.0)) == "FAIL"
    hostile = ErrorInfo(type="X", stage="setup", message="<script>alert(1)</script>")
    badge = render.badge_html(_result(RolloutStatus.SETUP_FAILED, None, error=hostile.line(), error_detail=hostile,
                                      isolation="none"))
    assert 'data-verdict="FAIL"' in badge and "<script>" not in badge and "isolation <b>none</b>" in badge
    assert "verify in no context (did not run)" in badge
    report = ArtifactReport(copied=["a.py"], missing=["b/*.py"], refused={"<c>.py": "a symlink"})
    room = render.badge_html(_result(RolloutStatus.COMPLETED, 0.0, verify_context="clean_room", artifacts=report))
    assert "verify in <b>a clean room</b>" in room
    assert "artifacts not taken: b/*.py (missing); &lt;c&gt;.py (a symlink)" in room
    ws = render.badge_html(_result(RolloutStatus.COMPLETED, 1.0, verify_context="workspace"))
    assert "verify in <b>the agent's workspace</b>" in ws
    assert "artifacts not taken" not in ws


def test_tables_files_turns_and_log_lines() -> None:
    cmd = CommandResult(cmd="echo hi", exit_code=0, stdout="x" * 1000, duration_s=0.1234)
    [row] = render.command_rows([cmd])
    assert row[:5] == [0, "echo hi", 0, 0.123, False] and len(row[5]) < 500
    files = render.files_html(_result(RolloutStatus.COMPLETED, 1.0, files={"a<b>.py": "x < y"}))
    assert "a&lt;b&gt;.py" in files and "x &lt; y" in files
    assert "No LLM turns" in render.turns_markdown(_result(RolloutStatus.COMPLETED, 1.0))
    line = render.event_line(ev.CommandFinished(rollout_id="r", phase="verify", index=2, result=cmd), 1.5)
    assert line.endswith("verify[2] exit 0 in 0.12s: echo hi") and "1.50s" in line


async def test_ui_runs_share_the_capacity_and_free_their_slot(settings: Settings) -> None:
    manager = SessionManager(settings.model_copy(update={"max_concurrent_envs": 1}))
    runs = UiRuns(manager)
    held = manager.create(SessionKind.WS)
    with pytest.raises(CapacityError):
        await anext(runs.stream("browser", build_request(_form("fizzbuzz"))))
    await manager.close(held.id)
    snapshots = [p async for p in runs.stream("browser", build_request(_form("fizzbuzz")))]
    assert snapshots[-1].result is not None and snapshots[-1].result.reward == 1.0
    assert any("verify[1] exit 0" in line for line in snapshots[-1].lines)
    assert manager.active == 0 and not runs.running("browser")


async def test_ui_cancel_ends_the_rollout_as_cancelled(settings: Settings, assert_no_leftovers: None) -> None:
    manager = SessionManager(settings)
    runs = UiRuns(manager)
    request = build_request(_form(solution="- sleep 600", agent_timeout_s=60.0))
    results = []
    async for progress in runs.stream("b", request):
        if any(line.endswith("agent ...") for line in progress.lines) and runs.running("b"):
            runs.cancel("b")
        results.append(progress.result)
    assert results[-1] is not None and results[-1].status is RolloutStatus.CANCELLED
    assert manager.active == 0 and not runs.cancel("b")
