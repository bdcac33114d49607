"""Imports go one way (DESIGN.md "Layout"): api -> session -> rollout / episode -> workspace / agents / llm / sandbox, never
back up, and no module imports itself back through others. Read from the source, every import counted (also
those under TYPE_CHECKING and inside functions); importing a module's own parent packages is not an edge."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import coding_agent_env

PACKAGE = Path(coding_agent_env.__file__).parent
ENTRY_POINTS = {"cli", "serve", "client"}
"""Root modules at the top: they may import anything, nothing below imports them."""
LEAVES = {path.stem for path in PACKAGE.glob("*.py")} - ENTRY_POINTS - {"__init__"} | {"models", "settings"}
"""Root modules every layer may use (errors, helpers), the settings' package and the wire models'."""
ALLOWED = {
    "models": {"settings", "verify_env"},  # the lowest layer: the wire limits and verify's search-path rules
    "gate": {"errors", "models", "settings"},
    # Trainer-side: imports where openenv and TRL are (no server dependencies; tests/compat/test_trainer_sessions.py).
    "harness": {"errors", "urls", "models", "settings", "llm", "rollout"},  # rollout: in-process sessions
    "workspace": LEAVES | {"sandbox"},  # one task's lifecycle, verify and scoring: below both of its drivers
    "sandbox": LEAVES,
    "llm": LEAVES | {"sandbox"},
    "agents": LEAVES | {"sandbox", "llm"},
    "rollout": LEAVES | {"sandbox", "llm", "agents", "workspace"},
    "episode": LEAVES | {"sandbox", "workspace"},  # its shell is the sandbox's (sandbox.shell), not an agent's
    # it hands the app's relay, sandbox backends, task set and metrics down
    "session": LEAVES | {"rollout", "episode", "llm", "sandbox", "tasks", "observe"},
    "observe": LEAVES,  # metrics of what the server does: below session and api, above only the wire models
    "tasks": LEAVES | {"sandbox", "rollout"},
    "runs": LEAVES | {"tasks", "rollout", "workspace", "sandbox", "client"},  # `run --server` drives a server over the client; workspace: the redactor
}
"""What each layer may import besides itself."""
API_ROOMS = {
    "tools": set(),  # the one table of tools: below every door
    "protocols": {"tools"},  # the doors (WS, JSON-RPC, MCP, HTTP) take their tools from the table
    "ui": {"tools", "heap"},  # the Gradio tab: the table's validation and texts; heap for its background build
}
"""The rooms of `api` and what each may import of the rest of `api` (its root modules compose them)."""


def module_name(path: Path) -> str:
    parts = ["coding_agent_env", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def imports(module: str) -> Iterator[str]:
    """The package's modules that `module` imports (a `from X import name` of a submodule counts as X.name)."""
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in MODULES:
            submodules = [f"{node.module}.{alias.name}" for alias in node.names]
            found = [name for name in submodules if name in MODULES]
            yield from found if len(found) == len(submodules) else [node.module, *found]
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name in MODULES)


def edges() -> dict[str, set[str]]:
    return {
        module: {target for target in imports(module) if not module.startswith(target + ".")}
        for module in MODULES
    }


def layer(module: str) -> str:
    return module.split(".")[1] if "." in module else "<root>"


def api_room(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "api" else None


def test_no_layer_imports_upward() -> None:
    upward = sorted(
        f"{module} -> {target}"
        for module, targets in edges().items()
        for target in targets
        if layer(module) in ALLOWED and layer(target) != layer(module) and layer(target) not in ALLOWED[layer(module)]
    )
    assert upward == []


def test_no_import_cycles() -> None:
    graph = edges()
    cycles: list[list[str]] = []
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = "open"
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                cycles.append([*path[path.index(target):], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert cycles == []


def test_api_rooms_import_only_what_they_may() -> None:
    crossing = sorted(
        f"{module} -> {target}"
        for module, targets in edges().items()
        if api_room(module) in API_ROOMS
        for target in targets
        if layer(target) == "api"
        and api_room(target) != api_room(module)
        and api_room(target) not in API_ROOMS[api_room(module) or ""]
    )
    assert crossing == []


def test_only_the_tab_imports_gradio() -> None:
    """The server answers before the tab is built: gradio is imported only by `api.ui` (its gate excepted)."""
    importers = sorted(
        module
        for module, path in MODULES.items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Import | ast.ImportFrom)
        and any(name.split(".")[0] == "gradio" for name in _imported_names(node))
    )
    outside = [module for module in importers if api_room(module) != "ui" or module.endswith(".ui.gate")]
    assert importers and outside == []


def _imported_names(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.ImportFrom):
        return [node.module or ""] if node.level == 0 else []
    return [alias.name for alias in node.names]
