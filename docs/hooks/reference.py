"""MkDocs hook: the reference pages, generated from the code at every build so they cannot drift.

    reference/settings.md   `Settings` and each sandbox backend's config: variable, type, default, docstring
    reference/routes.md     every route of `build_app`'s app, every WebSocket envelope and tool
    reference/metrics.md    every metric `ServerMetrics` registers: name, type, labels, help
    reference/models.md     the wire models (request, task, result, episode, state): every field
    reference/cli.md        `coding-agent-env <command> --help` for every command

A route of the app that `ROUTE_DOCS` does not describe (or a description of a route the app no longer has) fails
the build: the reference of the routes is the app's, with words a person wrote for each.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

GENERATED = {
    "reference/settings.md": "settings_page",
    "reference/routes.md": "routes_page",
    "reference/metrics.md": "metrics_page",
    "reference/models.md": "models_page",
    "reference/cli.md": "cli_page",
}
SCHEMA_SHOWN_CHARS = 4000
"""A tool's input schema longer than this is listed by its fields rather than printed."""
NOTE = "*Generated from the code at every docs build (`docs/hooks/reference.py`): do not edit.*\n\n"


def on_files(files: Files, config: Any) -> Files:
    for path, builder in GENERATED.items():
        files.append(File.generated(config, path, content=globals()[builder]()))
    return files


# --- field documentation -------------------------------------------------------------------------------------

def attribute_docs(cls: type) -> dict[str, str]:
    """Each field's attribute docstring (the string right below `name: type = ...`), through the class's bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass.__module__ in ("builtins", "pydantic.main") or klass is BaseModel:
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in zip(body, [*body[1:], None]):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and _is_doc(after):
                docs[node.target.id] = inspect.cleandoc(after.value.value)  # type: ignore[union-attr]
    return docs


def _is_doc(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def field_doc(cls: type[BaseModel], name: str, field: FieldInfo, docs: dict[str, str]) -> str:
    return one_line(field.description or docs.get(name, ""))


def one_line(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def type_name(annotation: Any) -> str:
    text = annotation.__name__ if isinstance(annotation, type) else str(annotation)
    text = re.sub(r"\b(typing|pathlib|pydantic|collections\.abc|coding_agent_env\.[\w.]+)\.", "", text)
    text = text.replace("NoneType", "None").replace("types.", "")
    return f"`{text}`".replace("|", "\\|")


def default_text(field: FieldInfo) -> str:
    if field.default_factory is not None:
        factory = field.default_factory
        if factory in (dict, list, tuple, set):
            return f"`{factory()!r}`"
        return f"computed: {_factory_text(factory)}"
    if field.default is PydanticUndefined:
        return "required"
    if field.default is None:
        return "unset"
    value = getattr(field.default, "value", field.default)
    return f"`{value!r}`" if not isinstance(value, str) else f"`{value}`"


def _factory_text(factory: Any) -> str:
    """What a default factory returns, as its source says (`a` or `b` for each return), else its name."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(factory)))
    except (OSError, TypeError, SyntaxError):
        return f"`{getattr(factory, '__name__', factory)}()`"
    returns = [ast.unparse(node.value) for node in ast.walk(tree) if isinstance(node, ast.Return) and node.value]
    return " or ".join(f"`{text}`" for text in returns) or f"`{factory.__name__}()`"


def model_table(cls: type[BaseModel], variable: Any = None) -> str:
    """A table of the model's fields; `variable(name)`: the environment variable of a field, or None."""
    docs = attribute_docs(cls)
    head = "| variable | field | type | default | meaning |\n|---|---|---|---|---|\n" if variable else \
        "| field | type | default | meaning |\n|---|---|---|---|\n"
    rows = []
    for name, field in cls.model_fields.items():
        cells = [f"`{name}`", type_name(field.annotation), default_text(field), field_doc(cls, name, field, docs)]
        if variable:
            env = variable(name)
            if env is None:
                continue
            cells.insert(0, f"`{env}`")
        rows.append("| " + " | ".join(cells) + " |")
    return head + "\n".join(rows) + "\n"


# --- settings --------------------------------------------------------------------------------------------------

def settings_page() -> str:
    from coding_agent_env.settings import Settings
    from coding_agent_env.settings.backends import BACKEND_KINDS

    parts = [
        "# Settings\n\n", NOTE,
        "Every setting is read once, from the environment, by `Settings.from_env()` "
        "(`coding_agent_env/settings/`): the upper-cased field name is the variable. A bad value stops the server "
        "at start with a message naming the variable. Defaults are defined here once.\n\n",
        "## Server settings (`Settings`)\n\n",
        model_table(Settings, lambda name: None if name == "backends" else name.upper()),
        "\n## Sandbox backends\n\n",
        "`SANDBOX_BACKENDS` (default `local`) names the enabled backends, comma-separated; the first is the "
        "default, and a request may pick only among them. Each enabled backend reads its own variables; a backend "
        "that is not enabled reads none.\n\n",
    ]
    for kind, model in BACKEND_KINDS.items():
        parts.append(f"### `{kind}` (`{model.__name__}`)\n\n{one_line(inspect.getdoc(model) or '')}\n\n")
        parts.append(model_table(model, lambda name, env=model.ENV: env.get(name)))
        parts.append("\n")
    return "".join(parts)


# --- routes ----------------------------------------------------------------------------------------------------

ROUTE_DOCS: dict[tuple[str, str], str] = {
    ("GET", "/health"): "Liveness: always `{\"status\":\"healthy\"}` (OpenEnv's exact body).",
    ("GET", "/health/loop"): "The event-loop watchdog's figures since start: `ticks`, `lag_last_ms`, `lag_max_ms`, "
                             "`stalls`, `last_stall`; 404 with `LOOP_WATCHDOG=false`.",
    ("GET", "/metadata"): "OpenEnv's `EnvironmentMetadata`: name, description, version.",
    ("GET", "/schema"): "JSON schemas of the action (`call_tool`), the observation, the state and the reset "
                        "observation.",
    ("POST", "/reset"): "Stateless, as upstream's: answers an empty observation; never touches a session.",
    ("POST", "/step"): "One action in a temporary session (holds a capacity slot while it runs; 503 at capacity).",
    ("GET", "/state"): "Stateless: a fresh `EnvState`.",
    ("GET", "/metrics"): "Prometheus text format ([metrics](metrics.md)); 404 with `METRICS_ENABLED=false`, 401 "
                         "without `Authorization: Bearer $METRICS_TOKEN` when that is set.",
    ("POST", "/mcp"): "OpenEnv JSON-RPC (`tools/list`, `tools/call`, `openenv/session/create`, "
                      "`openenv/session/close`) and real MCP (Streamable HTTP): a request carrying the MCP "
                      "handshake (`initialize`, or an `Mcp-Session-Id` header) goes to MCP.",
    ("GET", "/mcp"): "MCP's Streamable HTTP stream (with an `Mcp-Session-Id`).",
    ("DELETE", "/mcp"): "Ends an MCP session (with an `Mcp-Session-Id`).",
    ("POST", "/images"): "Builds a Harbor task's `environment/` (a tar) with the server's Docker backend, for "
                         "`run --server`; 403 unless `IMAGE_BUILDS=true`, 413 past `IMAGE_BUILD_MAX_MB`.",
    ("WS", "/ws"): "OpenEnv's envelope protocol (below); `?session_id=` attaches to a JSON-RPC session.",
    ("WS", "/mcp"): "Raw JSON-RPC frames in and out, one session per socket.",
    ("MOUNT", "/llm"): "The LLM relay's public route `/llm/v1/...` for remote sandboxes: per-rollout bearer tokens "
                       "only (401 otherwise).",
    ("GET", "/"): "Redirects to `/web/` (with the web tab on).",
    ("GET", "/web"): "Redirects to `/web/` (with the web tab on).",
    ("MOUNT", "/web"): "The Gradio tab (503 until it is built, or without the `ui` extra).",
    ("GET", "/list_environments"): "OpenEnv's Task API: `[\"coding_agent_env\"]`.",
    ("GET", "/{env}/splits"): "Task API: the task set's splits, `[{name, type, num_tasks}]` (501 without "
                                   "`serve --tasks`).",
    ("POST", "/{env}/tasks"): "Task API: a split's tasks (public part only).",
    ("POST", "/{env}/num_tasks"): "Task API: `{\"num_tasks\": n}` of a split.",
    ("POST", "/{env}/task"): "Task API: one task by `split` and `index` (400 out of range).",
    ("POST", "/{env}/task_range"): "Task API: tasks `start` to `stop` of a split.",
    ("GET", "/openapi.json"): "FastAPI's OpenAPI document (`info.version` 1.0.0: the OpenEnv HTTP profile).",
    ("GET", "/docs"): "FastAPI's Swagger UI.",
    ("GET", "/docs/oauth2-redirect"): "FastAPI's Swagger UI helper.",
    ("GET", "/redoc"): "FastAPI's ReDoc.",
}


def app_routes() -> list[tuple[str, str, str]]:
    """(method, path, module) of every route of a default app, HEAD left out, in the app's order."""
    from coding_agent_env.api import build_app
    from coding_agent_env.settings import Settings

    with tempfile.TemporaryDirectory() as state:
        app = build_app(Settings(state_dir=Path(state)))
        return list(_walk(app.routes))


def _walk(routes: list[Any]) -> Iterator[tuple[str, str, str]]:
    for route in routes:
        inner = getattr(route, "original_router", None)  # FastAPI >= 0.165 keeps included routers whole
        if inner is not None:
            yield from _walk(inner.routes)
            continue
        endpoint = getattr(route, "endpoint", None)
        module = getattr(endpoint, "__module__", None) or type(getattr(route, "app", route)).__module__
        methods = getattr(route, "methods", None)
        if methods:
            for method in sorted(set(methods) - {"HEAD"}):
                yield method, route.path, module
        elif type(route).__name__.endswith("WebSocketRoute"):
            yield "WS", route.path, module
        else:
            yield "MOUNT", route.path, module


def routes_page() -> str:
    from coding_agent_env.api.protocols.shapes import WS_ENVELOPES
    from coding_agent_env.api.tools import TOOLS

    routes = app_routes()
    keys = {(method, path) for method, path, _ in routes}
    missing = sorted(keys - set(ROUTE_DOCS))
    stale = sorted(set(ROUTE_DOCS) - keys)
    if missing or stale:
        raise SystemExit(f"docs/hooks/reference.py: routes without a description {missing}, described but gone {stale}")
    rows = "\n".join(f"| `{m}` | `{p}` | {ROUTE_DOCS[(m, p)]} | `{mod}` |" for m, p, mod in routes)
    envelopes = "\n".join(
        f"| `{kind}` | `{json.dumps(_example(model))}` | {one_line(_fields(model))} |"
        for kind, model in WS_ENVELOPES.items()
    )
    tools = "\n".join(
        f"| `{tool.name}` | {'yes' if tool.openenv else 'MCP only'} | {one_line(tool.description)} |" for tool in TOOLS
    )
    schemas = "\n\n".join(_tool_schema(tool.name, tool.schema()) for tool in TOOLS)
    return (
        f"# Routes and messages\n\n{NOTE}"
        "The routes of a default server (`build_app(Settings())`, web tab on, no task set). HEAD is answered "
        "wherever GET is.\n\n| method | path | what | module |\n|---|---|---|---|\n"
        f"{rows}\n\n## WebSocket `/ws`: what a client sends\n\n"
        "One JSON text frame per request; one reply per request, in order; `close` gets none. Every envelope "
        "refuses unknown keys (`{\"type\":\"state\",\"data\":{}}` is a `VALIDATION_ERROR`). Replies are "
        "`{\"type\":\"observation\",\"data\":{\"observation\",\"reward\",\"done\"}}`, "
        "`{\"type\":\"state\",\"data\":{...}}`, `{\"type\":\"mcp\",\"data\":<JSON-RPC response>}` or "
        "`{\"type\":\"error\",\"data\":{\"message\",\"code\"}}` with `code` one of `INVALID_JSON`, `UNKNOWN_TYPE`, "
        "`VALIDATION_ERROR`, `EXECUTION_ERROR` (the connection stays open), `CAPACITY_REACHED`, `SESSION_ERROR` "
        "(it closes). See [your first episode](../tutorials/first-episode.md) for a whole exchange.\n\n"
        "| `type` | shape | fields |\n|---|---|---|\n"
        f"{envelopes}\n\n## Tools\n\n"
        "A `step`'s `data` is `{\"type\":\"list_tools\"}` or `{\"type\":\"call_tool\",\"tool_name\":...,"
        "\"arguments\":{...}}`. `run_rollout`'s arguments are the [`RolloutRequest`](models.md#rolloutrequest) "
        "fields; `terminal` and `keystrokes` are offered while the session's episode lives.\n\n"
        f"| tool | OpenEnv paths | what |\n|---|---|---|\n{tools}\n\n{_jsonrpc()}\n## Tool input schemas\n\n{schemas}\n"
    )


def _tool_schema(name: str, schema: dict[str, Any]) -> str:
    text = json.dumps(schema, indent=1)
    if len(text) > SCHEMA_SHOWN_CHARS:  # a task's whole schema: its fields are the wire models' page
        fields = ", ".join(f"`{field}`" for field in schema.get("properties", {}))
        return f"### `{name}`\n\nAn object of these fields ([wire models](models.md)): {fields}."
    return f"### `{name}`\n\n```json\n{text}\n```"


def _jsonrpc() -> str:
    from coding_agent_env.api.protocols import jsonrpc

    doc = one_line((inspect.getdoc(jsonrpc) or "").split("\n\n")[0])
    codes = "\n".join(
        f"| `{value}` | `{name}` |" for name, value in vars(jsonrpc).items()
        if name.isupper() and isinstance(value, int) and -32800 < value <= -32000
    )
    return (
        "## JSON-RPC at `POST /mcp` (and `WS /mcp`)\n\n"
        f"{doc} Every answer is HTTP 200 with `{{\"jsonrpc\":\"2.0\",\"id\",\"result\"|\"error\"}}`; "
        "`params.session_id` names a session made by `openenv/session/create` (a WebSocket attaches to it with "
        "`/ws?session_id=`). A request carrying MCP's handshake goes to the real MCP server instead.\n\n"
        f"| code | meaning |\n|---|---|\n{codes}\n"
    )


def _example(model: type[BaseModel]) -> dict[str, Any]:
    example: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        if name == "type":
            example[name] = field.default if field.default is not PydanticUndefined else \
                field.annotation.__args__[0]  # type: ignore[union-attr]
        else:
            example[name] = {} if field.is_required() or field.default_factory is not None else field.default
    return example


def _fields(model: type[BaseModel]) -> str:
    fields = [
        f"`{name}` ({'required' if field.is_required() else 'optional'})"
        for name, field in model.model_fields.items() if name != "type"
    ]
    return ", ".join(fields) or "none"


# --- metrics ---------------------------------------------------------------------------------------------------

def metrics_page() -> str:
    from prometheus_client.metrics import MetricWrapperBase

    from coding_agent_env.observe.metrics import LiveCounts, ServerMetrics

    metrics = ServerMetrics(backends=("local",))
    metrics.watch(lambda: LiveCounts())
    labels_of = {
        wrapper.describe()[0].name: list(wrapper._labelnames)  # prometheus_client's: a metric's label names
        for wrapper in vars(metrics).values() if isinstance(wrapper, MetricWrapperBase)
    }
    rows = []
    for family in metrics.registry.collect():
        labels = labels_of.get(family.name)
        if labels is None:  # a gauge read at scrape time: its labels are in its samples
            labels = sorted({key for sample in family.samples for key in sample.labels})
        name = family.name + ("_total" if family.type == "counter" else "")
        rows.append((name, family.type, labels, family.documentation))
    table = "\n".join(
        f"| `{name}` | {kind} | {', '.join(f'`{label}`' for label in labels)} | {one_line(doc)} |"
        for name, kind, labels, doc in rows
    )
    return (
        f"# Metrics\n\n{NOTE}`GET /metrics` answers these in Prometheus's text format. Label values come from closed "
        "sets (anything outside is `other`); no id and no text a request carries is ever a label value. Settings: "
        "`METRICS_ENABLED`, `METRICS_TOKEN` ([settings](settings.md)).\n\n"
        f"| metric | type | labels | meaning |\n|---|---|---|---|\n{table}\n\n## Label value sets\n\n"
        "The closed sets of `coding_agent_env.observe.metrics` (agents, backends and task splits are the server's "
        "own; a task set's rollouts outside it count as `adhoc`):\n\n" + _label_sets()
    )


def _label_sets() -> str:
    from coding_agent_env.observe import metrics

    rows = [
        f"| `{name}` | {', '.join(f'`{value}`' for value in value)} |"
        for name, value in vars(metrics).items()
        if name.isupper() and isinstance(value, tuple) and value and all(isinstance(v, str) for v in value)
    ]
    return "| set | values |\n|---|---|\n" + "\n".join(rows) + "\n"


# --- wire models -----------------------------------------------------------------------------------------------

def models_page() -> str:
    from coding_agent_env.env_state import EnvState
    from coding_agent_env.episode import EpisodeReport, TerminalResult
    from coding_agent_env.models import RolloutRequest, RolloutResult, Task

    roots: list[type[BaseModel]] = [RolloutRequest, Task, RolloutResult, EpisodeReport, TerminalResult, EnvState]
    seen: list[type[BaseModel]] = []
    queue = list(roots)
    while queue:
        model = queue.pop(0)
        if model in seen:
            continue
        seen.append(model)
        queue.extend(_nested_models(model))
    parts = [f"# Wire models\n\n{NOTE}What requests carry and results hold, field by field (`coding_agent_env/models/`, "
             "`episode/report.py`, `env_state.py`). Unknown fields are refused in requests.\n\n"]
    for model in seen:
        doc = one_line(inspect.getdoc(model) or "")
        parts.append(f"## {model.__name__}\n\n`{model.__module__}`. {doc}\n\n{model_table(model)}\n")
    return "".join(parts)


def _nested_models(model: type[BaseModel]) -> Iterator[type[BaseModel]]:
    for field in model.model_fields.values():
        yield from _models_in(field.annotation)


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        yield from _models_in(arg)


# --- CLI -------------------------------------------------------------------------------------------------------

def cli_page() -> str:
    top = _help([])
    match = re.search(r"\{([\w,-]+)\}", top)
    commands = match.group(1).split(",") if match else []
    parts = [f"# Command line\n\n{NOTE}`coding-agent-env --help`:\n\n```text\n{top}```\n"]
    for command in commands:
        parts.append(f"\n## `{command}`\n\n```text\n{_help([command])}```\n")
    return "".join(parts)


def _help(args: list[str]) -> str:
    done = subprocess.run([sys.executable, "-m", "coding_agent_env.cli", *args, "--help"], capture_output=True,
                          text=True, timeout=60, env={"COLUMNS": "110", "PATH": "/usr/bin:/bin"})
    return done.stdout or done.stderr
