"""The web tab's "Interactive" tab: start an episode from a preset, type commands, read the transcript
(command, exit code, output), submit a final answer, see the reward. Cancel tears the episode down.

It drives `UiEpisodes` (one UI session per episode, from the shared capacity). Errors of a call (capacity
full, no episode, an ended one, a bad command) are shown as a banner; the episode stays usable where it can.
"""

from __future__ import annotations

from collections.abc import Mapping

import gradio as gr

from coding_agent_env.api.ui import render
from coding_agent_env.api.ui.episodes import UiEpisode, UiEpisodes
from coding_agent_env.api.ui.presets import PRESETS, Preset
from coding_agent_env.episode import EpisodeReport
from coding_agent_env.episode.task import TASK_FIELDS
from coding_agent_env.errors import RequestError

__all__ = ["interactive_tab", "report_html"]


def report_html(report: EpisodeReport | None) -> str:
    """The episode's banner: its status, and once scored the reward and verify's outcome."""
    if report is None:
        return render.message_html("No episode: pick a preset and start one.", kind="info")
    where = f"sandbox {report.sandbox} ({report.isolation})"
    if report.status.value == "running":
        return render.message_html(f"Episode running in {where}: {report.step_count} step(s)", kind="info")
    if report.reward is None:
        why = f": {report.error.message}" if report.error is not None else ""
        return render.message_html(f"Episode {report.status.value}, reward null{why}")
    passed = sum(1 for r in report.verify_results if r.ok)
    verdict = "PASS" if report.reward >= 1.0 else "PARTIAL" if report.reward > 0 else "FAIL"
    css = {"PASS": "cae-pass", "PARTIAL": "cae-partial", "FAIL": "cae-fail"}[verdict]
    return (f'<div class="cae-result" data-verdict="{verdict}"><span class="cae-badge {css}">{verdict}</span>'
            f"reward <b>{report.reward:g}</b> · status {report.status.value} · {passed}/{len(report.verify_results)} "
            f"verify commands passed · verify in the {(report.verify_context or 'workspace').replace('_', ' ')}</div>")


def interactive_tab(episodes: UiEpisodes, sandboxes: list[tuple[str, str]],
                    presets: Mapping[str, Preset] = PRESETS) -> None:
    """The tab's components and events (call inside a `gr.Tab`). `presets`: the tasks it offers, but multi-step
    ones (a rollout's, not an episode's)."""
    presets = {name: preset for name, preset in presets.items() if not preset.steps}
    first = next(iter(presets))
    with gr.Row():
        preset = gr.Dropdown(list(presets), value=first, label="Preset", elem_id="ep-preset")
        sandbox = gr.Dropdown(sandboxes, value=sandboxes[0][1], label="Sandbox", elem_id="ep-sandbox")
    instruction = gr.Textbox(presets[first].instruction, label="Instruction", lines=3, interactive=False,
                             elem_id="ep-instruction")
    with gr.Row():
        start_btn = gr.Button("Start episode", variant="primary", elem_id="ep-start")
        cancel_btn = gr.Button("Cancel", variant="stop", elem_id="ep-cancel")
    status = gr.HTML(report_html(None), elem_id="ep-status")
    transcript = gr.Textbox(label="Terminal transcript", lines=14, max_lines=30, interactive=False,
                            elem_id="ep-transcript")
    with gr.Row():
        command = gr.Textbox(label="Command", placeholder="ls -la", scale=4, elem_id="ep-command")
        run_btn = gr.Button("Run", scale=1, elem_id="ep-run")
    with gr.Row():
        answer = gr.Textbox(label="Final answer", placeholder="ends the episode: verify and score", scale=4,
                            elem_id="ep-answer")
        submit_btn = gr.Button("Submit final answer", scale=1, elem_id="ep-submit")

    preset.change(lambda name: presets[name].instruction, inputs=preset, outputs=instruction)

    async def start(name: str, backend: str, request: gr.Request) -> tuple[str, str]:
        task = presets[name].task_fields(TASK_FIELDS)  # every field an episode takes that the preset sets
        try:
            view = await episodes.start(_owner(request), {**task, "sandbox": backend})
        except RequestError as exc:
            return render.message_html(str(exc)), ""
        return report_html(view.report()), view.text()

    async def run(text: str, request: gr.Request) -> tuple[str, str, str]:
        owner = _owner(request)
        try:
            await episodes.run(owner, text)
        except RequestError as exc:
            return render.message_html(str(exc)), _text(episodes.get(owner)), text
        view = episodes.get(owner)
        return report_html(view.report() if view else None), _text(view), ""

    async def submit(text: str, request: gr.Request) -> tuple[str, str]:
        owner = _owner(request)
        try:
            report = await episodes.answer(owner, text)
        except RequestError as exc:
            return render.message_html(str(exc)), _text(episodes.get(owner))
        return report_html(report), _text(episodes.get(owner))

    async def cancel(request: gr.Request) -> str:
        if await episodes.cancel(_owner(request)):
            return render.message_html("Episode cancelled: its sandbox was torn down.", kind="info")
        return render.message_html("No episode to cancel.", kind="info")

    start_btn.click(start, inputs=[preset, sandbox], outputs=[status, transcript], concurrency_limit=None)
    run_btn.click(run, inputs=command, outputs=[status, transcript, command], concurrency_limit=None)
    command.submit(run, inputs=command, outputs=[status, transcript, command], concurrency_limit=None)
    submit_btn.click(submit, inputs=answer, outputs=[status, transcript], concurrency_limit=None)
    cancel_btn.click(cancel, outputs=status, concurrency_limit=None)


def _owner(request: gr.Request) -> str:
    return request.session_hash or ""


def _text(view: UiEpisode | None) -> str:
    return view.text() if view is not None else ""
