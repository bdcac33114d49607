"""The Gradio tab at `/web`: pick a preset, agent, sandbox and endpoint, edit the task, run, watch, inspect.

`build_web(manager)` builds the Blocks and gradio's app for them; `api.ui.gate.WebGate` serves it at `/web`
once built (in the background, so the server answers at once).
Rollouts go through `UiRuns`, i.e. through the app's one `SessionManager` (shared capacity, INTEGRITY 17).
A key typed into the api_key box goes into the request as a `SecretStr` and nowhere else: no output of the
tab carries it, errors about the form never quote values, and the pipeline redacts it from results.
gradio's run history is off: its routes answer without the tab's login and act on the Hugging Face Hub with the
host's own token (the operator's HF_TOKEN) for a browser on loopback.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import gradio as gr
from fastapi import FastAPI
from starlette.routing import Mount
from starlette.types import ASGIApp

from coding_agent_env.api.ui import render
from coding_agent_env.api.ui.episodes import UiEpisodes
from coding_agent_env.api.ui.form import (
    CUSTOM_ENDPOINT,
    DEFAULT_ENDPOINT,
    EDITORS,
    Form,
    FormError,
    agent_choices,
    build_request,
    default_agent,
    endpoint_choices,
    preset_texts,
)
from coding_agent_env.api.ui.gate import WEB_PATH
from coding_agent_env.api.ui.interactive_tab import interactive_tab
from coding_agent_env.api.ui.presets import PRESETS, Preset, with_task_set
from coding_agent_env.api.ui.server_tab import server_tab
from coding_agent_env.observe.metrics import ServerMetrics
from coding_agent_env.api.ui.result_view import result_tabs
from coding_agent_env.api.ui.rollouts import Progress, UiRuns
from coding_agent_env.api.ui.runs_tab import runs_tab
from coding_agent_env.errors import CodingAgentEnvError, RequestError
from coding_agent_env.sandbox.registry import Backends
from coding_agent_env.session import SessionManager
from coding_agent_env.settings import Settings

__all__ = ["WEB_PATH", "WebTab", "build_web"]

_CSS = """
.cae-badge {display:inline-block; padding:2px 12px; border-radius:6px; font-weight:700; color:#fff; margin-right:8px}
.cae-pass {background:#15803d} .cae-partial {background:#b45309} .cae-fail {background:#b91c1c}
.cae-result {font-size:1.05em; line-height:1.8}
.cae-message {padding:8px 12px; border-radius:6px; font-weight:600}
.cae-error {background:#fee2e2; color:#7f1d1d} .cae-info {background:#e0f2fe; color:#0c4a6e}
.cae-warning {background:#fef3c7; color:#78350f}
.cae-file pre {max-height:320px; overflow:auto; font-size:0.85em; padding:6px; background:rgba(127,127,127,0.08)}
"""

_THEME = gr.themes.Soft(
    font=["ui-sans-serif", "system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"]
)
"""System fonts only: the page loads nothing from outside the server."""

_FORM_FIELDS = tuple(Form.__dataclass_fields__)


@dataclass(frozen=True)
class WebTab:
    """What the mounted tab runs: rollouts and interactive episodes. `stop()` ends them (server shutdown)."""

    runs: UiRuns
    episodes: UiEpisodes

    async def stop(self) -> None:
        try:
            await self.runs.stop()
        finally:
            await self.episodes.stop()


def build_web(manager: SessionManager) -> tuple[WebTab, FastAPI, ASGIApp]:
    """Build the tab: (its `WebTab`, whose `stop()` the server's shutdown awaits; a holder app whose lifespan
    runs the tab's startup (gradio's queue); the tab's ASGI app, to serve at `WEB_PATH`). Runs anywhere (a
    worker thread included): nothing here needs the server's loop."""
    runs = UiRuns(manager)
    episodes = UiEpisodes(manager)
    holder = FastAPI()

    def mount() -> None:
        blocks = build_blocks(runs, manager.settings, manager.backends, episodes, with_task_set(manager.catalog),
                              manager.metrics)
        gr.mount_gradio_app(
            holder, blocks, path=WEB_PATH, ssr_mode=False, mcp_server=False, footer_links=[], theme=_THEME, css=_CSS,
            run_history=False,  # its routes skip the login and use the host's HF token (module docstring)
            **login(manager.settings),
        )

    _with_running_loop(mount)
    [gradio_app] = [route.app for route in holder.routes if isinstance(route, Mount) and route.path == WEB_PATH]
    return WebTab(runs, episodes), holder, gradio_app


def login(settings: Settings) -> dict[str, Any]:
    """gradio's login for the tab when the server has a caller token (`settings.api_token`): any user name, the
    token as password (compared in constant time); none otherwise."""
    if settings.api_token is None:
        return {}
    token = settings.api_token.get_secret_value().encode()

    def check(_user: str, password: str) -> bool:
        return hmac.compare_digest(password.encode(), token)

    return {"auth": check, "auth_message": "This server requires its API token: any user name, the token as password."}


def _with_running_loop(build: Callable[[], None]) -> None:
    """Call `build` where a loop is running.

    Why: gradio's Blocks and App constructors, called with no running loop, each create and install a new event
    loop that is never closed (`gradio.utils.safe_get_lock`), leaking its sockets. Its locks bind to a loop only
    on first contended use, so building under a short-lived loop is safe.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        async def under_loop() -> None:
            build()

        asyncio.run(under_loop())
    else:
        build()


def isolation_warning(backends: Backends) -> str | None:
    """The banner's text when an enabled backend runs commands without isolation (the operator's opt-in)."""
    off = []
    for name in backends.names:
        try:
            status = backends.get(name).check()
        except CodingAgentEnvError:
            continue
        if status.available and status.isolation == "none":
            off.append(name)
    if not off:
        return None
    return (f"Isolation is off on {', '.join(off)}: commands run as plain host processes with the host's network "
            "(the operator's opt-in). Do not run untrusted agents here.")


def _sandbox_choices(backends: Backends) -> list[tuple[str, str]]:
    choices = []
    for name in backends.names:
        try:
            backend = backends.get(name)
            status = backend.check()
            note = f"isolation: {status.isolation}" if status.available else f"unavailable: {status.detail}"
            if status.available and backend.network_refusal("llm") is not None:
                note += "; no CLI agents (the operator has not enabled the public relay)"
        except CodingAgentEnvError as exc:
            note = f"unavailable: {exc}"
        choices.append((f"{name} ({note})", name))
    return choices


def build_blocks(
    runs: UiRuns, settings: Settings, backends: Backends, episodes: UiEpisodes | None = None,
    presets: Mapping[str, Preset] = PRESETS, metrics: ServerMetrics | None = None,
) -> gr.Blocks:
    """Two tabs: "Rollout" (preset -> editors, Run (streaming), Cancel) and, with `episodes`, "Interactive"
    (`ui.interactive_tab`), then "Runs" (the results store, `ui.runs_tab`) and, with `metrics`, "Server" (what
    the server does now, `ui.server_tab`). `presets`: the tasks both offer (the
    built-in ones and the server's task set: `presets.with_task_set`)."""
    with gr.Blocks(title="coding-agent-env", analytics_enabled=False) as blocks:
        gr.Markdown("# coding-agent-env")
        warning = isolation_warning(backends)
        if warning is not None:
            gr.HTML(render.message_html(warning, kind="warning"), elem_id="isolation-warning")
        with gr.Tab("Rollout", elem_id="tab-rollout"):
            _rollout_tab(runs, settings, backends, presets)
        if episodes is not None:
            with gr.Tab("Interactive", elem_id="tab-interactive"):
                gr.Markdown(
                    "Be the agent: start an episode from a preset, run commands in its sandbox (a persistent "
                    "shell), then submit a final answer to verify and score it."
                )
                interactive_tab(episodes, _sandbox_choices(backends), presets)
        with gr.Tab("Runs", elem_id="tab-runs"):
            runs_tab(settings)
        if metrics is not None:
            with gr.Tab("Server", elem_id="tab-server"):
                server_tab(metrics)
    return blocks


def _rollout_tab(runs: UiRuns, settings: Settings, backends: Backends, presets: Mapping[str, Preset]) -> None:
    """The rollout tab's layout and its three events: preset -> editors, Run (streaming), Cancel."""
    gr.Markdown(
        "Run one coding-agent rollout: sandbox → setup → agent → verify → reward. "
        "The `oracle` agent runs the task's reference solution and needs no LLM."
    )
    with gr.Row():
        with gr.Column(scale=3):
            form = _task_editors(presets)
        with gr.Column(scale=2):
            form.update(_run_options(settings, backends))
    with gr.Row():
        run_btn = gr.Button("Run", variant="primary", elem_id="run")
        cancel_btn = gr.Button("Cancel", variant="stop", elem_id="cancel")
    out = _result_view()
    editors = [form[name] for name in EDITORS]
    form["preset"].change(
        lambda name: list(preset_texts(presets[name]).values()), inputs=form["preset"], outputs=editors
    )
    inputs = {form[name] for name in _FORM_FIELDS}

    async def run(values: dict[gr.components.Component, Any], request: gr.Request) -> AsyncIterator[dict[Any, Any]]:
        by_name = {name: values[form[name]] for name in _FORM_FIELDS}
        async for update in _run_updates(runs, request.session_hash or "", by_name, out, presets):
            yield update

    async def cancel(request: gr.Request) -> str:
        if runs.cancel(request.session_hash or ""):
            return render.message_html("Cancelling: the sandbox is being torn down…", kind="info")
        return render.message_html("Nothing is running.", kind="info")

    run_btn.click(run, inputs=inputs, outputs=list(out.values()), concurrency_limit=None)
    cancel_btn.click(cancel, outputs=out["cancel_note"], concurrency_limit=None, queue=False)


def _task_editors(presets: Mapping[str, Preset]) -> dict[str, Any]:
    first = next(iter(presets))
    text = preset_texts(presets[first])
    editors = {
        "preset": gr.Dropdown(list(presets), value=first, label="Preset", elem_id="preset"),
        "instruction": gr.Textbox(text["instruction"], label="Instruction", lines=4, elem_id="instruction"),
        "files": gr.Code(text["files"], language="yaml", label="Files (YAML: path: text)", elem_id="files"),
        "setup": gr.Code(text["setup"], language="yaml", label="Setup commands (YAML list)", elem_id="setup"),
        "verify": gr.Code(text["verify"], language="yaml", label="Verify commands (YAML list)", elem_id="verify"),
    }
    with gr.Accordion("Clean room: hidden verify files and artifacts", open=False):
        editors["verify_files"] = gr.Code(
            text["verify_files"], language="yaml", label="Verify files (YAML: path: text; written only for verify)",
            elem_id="verify-files",
        )
        editors["artifacts"] = gr.Code(
            text["artifacts"], language="yaml",
            label="Artifacts (YAML list of paths or globs; when given, verify runs in a clean room)",
            elem_id="artifacts",
        )
    editors["solution"] = gr.Code(
        text["solution"], language="yaml", label="Solution (oracle agent; YAML list)", elem_id="solution"
    )
    return editors


def _run_options(settings: Settings, backends: Backends) -> dict[str, Any]:
    sandboxes = _sandbox_choices(backends)
    options: dict[str, Any] = {
        "agent": gr.Dropdown(agent_choices(settings), value=default_agent(), label="Agent", elem_id="agent"),
        "sandbox": gr.Dropdown(sandboxes, value=sandboxes[0][1], label="Sandbox", elem_id="sandbox"),
    }
    with gr.Accordion("LLM endpoint (LLM agents only)", open=False):
        options["endpoint"] = gr.Dropdown(
            endpoint_choices(settings), value=DEFAULT_ENDPOINT, label="Endpoint", elem_id="endpoint"
        )
        options["model"] = gr.Textbox(label="Model", placeholder="the endpoint's default model", elem_id="model")
        options["base_url"] = gr.Textbox(
            label=f"base_url ({CUSTOM_ENDPOINT} only)", placeholder="https://…/v1", elem_id="base-url"
        )
        options["api_key"] = gr.Textbox(
            label="api_key (sent with this rollout only; never shown, logged or stored)", type="password",
            elem_id="api-key",
        )
        options["mode"] = gr.Radio(["black_box", "transparent_proxy"], value="black_box", label="Mode")
    with gr.Accordion("Tunables", open=False):
        options["agent_timeout_s"] = gr.Number(600, label="agent_timeout_s", minimum=1)
        options["command_timeout_s"] = gr.Number(120, label="command_timeout_s", minimum=1)
        options["max_tokens_cap"] = gr.Number(None, label="max_tokens_cap (empty: none)", minimum=1, precision=0)
        options["top_logprobs"] = gr.Number(
            0, label="top_logprobs (transparent_proxy)", minimum=0, maximum=20, precision=0
        )
        options["disable_thinking"] = gr.Checkbox(False, label="disable_thinking")
        options["task_id"] = gr.Textbox(label="task_id")
    return options


def _result_view() -> dict[str, Any]:
    out: dict[str, Any] = {
        "cancel_note": gr.HTML(elem_id="cancel-note"),  # its own element: a late ack must not hide the result
        "notice": gr.HTML(elem_id="notice"),
        "log": gr.Textbox(label="Live phase log", lines=8, max_lines=16, elem_id="log"),
    }
    out.update(result_tabs({"files": "files-view", "turns": "turns-view"}))
    return out


async def _run_updates(
    runs: UiRuns, owner: str, values: dict[str, Any], out: dict[str, Any], presets: Mapping[str, Preset] = PRESETS
) -> AsyncIterator[dict[Any, Any]]:
    """Validate the form, run, and turn each `Progress` into component updates."""
    try:
        request = build_request(Form(**values), presets)
    except FormError as exc:
        yield {out["notice"]: render.message_html(f"Invalid form: {exc}")}
        return
    yield {out["notice"]: render.message_html("Starting…", kind="info"), out["log"]: "", out["cancel_note"]: ""}
    try:
        async for progress in runs.stream(owner, request):
            yield _progress_updates(progress, out)
    except RequestError as exc:  # capacity full, busy, unknown agent/backend/endpoint: nothing ran
        yield {out["notice"]: render.message_html(str(exc))}


def _progress_updates(progress: Progress, out: dict[str, Any]) -> dict[Any, Any]:
    updates: dict[Any, Any] = {out["log"]: "\n".join(progress.lines)}
    result = progress.result
    if result is None:
        return updates
    updates.update({out[name]: value for name, value in render.result_parts(result).items()})
    return updates
