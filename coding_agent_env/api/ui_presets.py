"""Kept for code outside the api room that imports the presets from here; they live in `api.ui.presets`."""

from coding_agent_env.api.ui.presets import PRESETS, Preset

__all__ = ["PRESETS", "Preset"]
