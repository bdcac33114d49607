"""The web tab's form: presets to editor text, editor values to a `RolloutRequest`, and the selector choices.

Contracts:
- `build_request(form)` returns a `RolloutRequest` validated by the `run_rollout` tool (`api.tools`, as on every
  door) or raises `FormError` whose message names the field and the rule broken, never the value entered (so a pasted key cannot be echoed back through an error).
- Command lists, artifact patterns and files are edited as YAML (a list of strings; a mapping of path ->
  text), so multi-line commands such as heredocs survive the round trip. `EDITORS` names the task editors, in
  the order `preset_texts` fills them from a preset's `Task` fields.
- The selected preset's other task fields (those with neither an editor nor a run option, e.g. `env` or
  `limits` when a preset sets them) reach the request as the preset has them.
- `agent_choices()` lists every agent name the wire accepts, marking the ones this server can run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import SecretStr

from coding_agent_env.agents.registry import available_agents, get_agent
from coding_agent_env.api.tools import ROLLOUT
from coding_agent_env.api.ui.presets import PRESETS, Preset
from coding_agent_env.errors import CodingAgentEnvError, RequestError
from coding_agent_env.llm import catalog
from coding_agent_env.models import AGENT_NAMES, RolloutRequest, Task
from coding_agent_env.settings import Settings

__all__ = [
    "CUSTOM_ENDPOINT",
    "DEFAULT_ENDPOINT",
    "EDITORS",
    "Form",
    "FormError",
    "agent_choices",
    "build_request",
    "default_agent",
    "dump_yaml",
    "endpoint_choices",
    "preset_texts",
]

DEFAULT_ENDPOINT = "server default"
EDITORS = ("instruction", "files", "setup", "verify", "verify_files", "artifacts", "solution")
CUSTOM_ENDPOINT = "custom (base_url + api_key)"


class FormError(ValueError):
    """The form cannot make a request; the message is safe to show."""


@dataclass(frozen=True)
class Form:
    """What the editors and selectors hold when Run is pressed (Gradio gives None for an empty box)."""

    instruction: str | None
    files: str | None
    setup: str | None
    verify: str | None
    solution: str | None
    agent: str
    sandbox: str | None
    endpoint: str | None
    model: str | None = None
    base_url: str | None = None
    api_key: str | None = None
    mode: str = "black_box"
    agent_timeout_s: float | None = None
    command_timeout_s: float | None = None
    max_tokens_cap: float | None = None
    disable_thinking: bool = False
    top_logprobs: float | None = None
    task_id: str | None = None
    verify_files: str | None = None
    artifacts: str | None = None
    preset: str | None = None


def _text(value: str | None) -> str:
    return (value or "").strip()


class _LiteralDumper(yaml.SafeDumper):
    """Dumps multi-line strings as `|` blocks so commands stay readable."""


def _str_representer(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_LiteralDumper.add_representer(str, _str_representer)


def dump_yaml(value: list[str] | dict[str, str]) -> str:
    """Editor text for a command list or a files mapping (empty editor for an empty one)."""
    if not value:
        return ""
    return yaml.dump(value, Dumper=_LiteralDumper, sort_keys=False, allow_unicode=True, width=1000)


def preset_texts(preset: Task) -> dict[str, str]:
    """Editor name -> its text for a preset's task, in the order of `EDITORS`."""
    return {
        name: preset.instruction if name == "instruction" else dump_yaml(getattr(preset, name)) for name in EDITORS
    }


def _load_yaml(text: str | None, field: str) -> Any:
    if not _text(text):
        return None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise FormError(f"{field}: not valid YAML{where}") from None


def _strings(text: str | None, field: str, what: str = "command strings") -> list[str]:
    value = _load_yaml(text, field)
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise FormError(f"{field}: expected a YAML list of {what}")
    return value


def _files(text: str | None, field: str = "files") -> dict[str, str]:
    value = _load_yaml(text, field)
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise FormError(f"{field}: expected a YAML mapping of relative path -> file text")
    return value


def _endpoint_fields(form: Form) -> dict[str, Any]:
    model = _text(form.model) or None
    key = SecretStr(form.api_key) if form.api_key else None
    if form.endpoint == CUSTOM_ENDPOINT:
        if not _text(form.base_url) or key is None or model is None:
            raise FormError("a custom endpoint needs base_url, api_key and model")
        return {"base_url": _text(form.base_url), "api_key": key, "model": model}
    endpoint = None if form.endpoint in (None, "", DEFAULT_ENDPOINT) else form.endpoint
    return {"endpoint": endpoint, "api_key": key if endpoint is not None else None, "model": model}


def _tunables(form: Form) -> dict[str, Any]:
    """Numbers and flags; an emptied number box falls back to the request model's default."""
    values: dict[str, Any] = {
        "mode": form.mode,
        "disable_thinking": bool(form.disable_thinking),
        "max_tokens_cap": int(form.max_tokens_cap) if form.max_tokens_cap else None,
        "task_id": _text(form.task_id) or None,
        "agent_timeout_s": form.agent_timeout_s,
        "command_timeout_s": form.command_timeout_s,
        "top_logprobs": None if form.top_logprobs is None else int(form.top_logprobs),
    }
    return {name: value for name, value in values.items() if value is not None}


def _preset_fields(name: str | None, presets: Mapping[str, Preset]) -> dict[str, Any]:
    """The selected preset's task fields that no editor or run option of the form holds."""
    preset = presets.get(name or "")
    if preset is None:
        return {}
    return preset.task_fields(set(Task.model_fields) - set(Form.__dataclass_fields__))


def build_request(form: Form, presets: Mapping[str, Preset] = PRESETS) -> RolloutRequest:
    """The request the form describes (`presets`: what its preset names), or FormError (value-free message)."""
    fields: dict[str, Any] = {
        **_preset_fields(form.preset, presets),
        "instruction": form.instruction or "",
        "files": _files(form.files),
        "setup": _strings(form.setup, "setup"),
        "verify": _strings(form.verify, "verify"),
        "verify_files": _files(form.verify_files, "verify_files"),
        "artifacts": _strings(form.artifacts, "artifacts", "workdir-relative paths or globs"),
        "solution": _strings(form.solution, "solution"),
        "agent": form.agent,
        "sandbox": form.sandbox or None,
        **_tunables(form),
        **_endpoint_fields(form),
    }
    try:
        return ROLLOUT.validate(fields)  # the run_rollout tool's own validation, as every door's
    except RequestError as exc:
        raise FormError(str(exc)) from None


def agent_choices(settings: Settings) -> list[tuple[str, str]]:
    """(label, value) for every agent name; the label says whether this server can run it."""
    registered = set(available_agents())
    return [(f"{name} ({_agent_state(name, registered, settings)})", name) for name in AGENT_NAMES]


def _agent_state(name: str, registered: set[str], settings: Settings) -> str:
    if name not in registered:
        return "not available here"
    try:
        agent = get_agent(name)
        agent.check_available(settings)
    except CodingAgentEnvError:
        return "not installed"
    return "installed, needs an LLM" if agent.needs_llm else "installed"


def default_agent() -> str:
    """`oracle` when it is available (it runs without an LLM), else the first registered agent."""
    names = available_agents()
    return "oracle" if "oracle" in names else names[0]


def endpoint_choices(settings: Settings) -> list[tuple[str, str]]:
    """(label, value): the server default, each catalog entry (saying whether a key is held), custom."""
    default = settings.llm_default_endpoint
    choices = [(f"{DEFAULT_ENDPOINT}: {default}" if default else DEFAULT_ENDPOINT, DEFAULT_ENDPOINT)]
    for name, entry in sorted(catalog(settings).items()):
        if entry.api_key is not None:
            held = "server key"
        else:
            held = "bring a key" if entry.needs_key else "no key needed"
        choices.append((f"{name} ({held})", name))
    choices.append((CUSTOM_ENDPOINT, CUSTOM_ENDPOINT))
    return choices
