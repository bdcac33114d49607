"""The Gradio tab at `/web`, a package of its own.

`gate` (`WebGate`) is what the app mounts at `/web`: it imports nothing heavy, and builds the tab in the background
once the server is up. Everything else here imports gradio and is loaded only by that build: `tab` (`build_web`:
the Blocks and their three tabs), `form` and `presets` (the rollout form and its presets), `render` (pure HTML and
rows, no gradio), `rollouts` and `episodes` (what the tab runs, through the app's one session manager),
`interactive_tab` and `runs_tab` (the Interactive and Runs tabs).

This `__init__` imports nothing, so `api.ui.gate` stays cheap to import.
"""
