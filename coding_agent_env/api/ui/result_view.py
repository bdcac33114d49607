"""A rollout result's tabs, laid out alike on the Rollout tab (the run just done) and the Runs tab (a stored one)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gradio as gr

from coding_agent_env.api.ui import render

__all__ = ["result_tabs"]


def result_tabs(elem_ids: Mapping[str, str]) -> dict[str, Any]:
    """Commands, Files, Turns, Agent log and Raw JSON tabs (call inside a layout); their components by the part
    they show (`render.result_parts`' names). `elem_ids`: the ids of the parts a page or a test finds by id."""
    parts: dict[str, Any] = {}
    with gr.Tabs():
        with gr.Tab("Commands"):
            for name, label in (("setup", "Setup"), ("verify", "Verify")):
                parts[name] = gr.Dataframe(headers=render.COMMAND_COLUMNS, label=label, wrap=True,
                                           elem_id=elem_ids.get(name))
        with gr.Tab("Files"):
            parts["files"] = gr.HTML(elem_id=elem_ids.get("files"))
        with gr.Tab("Turns"):
            parts["turns"] = gr.Markdown(elem_id=elem_ids.get("turns"))
        with gr.Tab("Agent log"):
            parts["agent_log"] = gr.Code(language=None, label="agent log (tail)", elem_id=elem_ids.get("agent_log"))
        with gr.Tab("Raw JSON"):
            parts["raw"] = gr.Code(language="json", label="RolloutResult", elem_id=elem_ids.get("raw"))
    return parts
