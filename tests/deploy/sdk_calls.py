"""What the installed k8s-agent-sandbox SDK asks of the Kubernetes API, read from its source: per resource
(group, plural), the RBAC verbs of the custom-object calls its functions make. Read, not imported, so a new SDK
release that calls more than the Role grants fails the deploy tests instead of failing on a cluster."""

from __future__ import annotations

import ast
import importlib.util
from collections import defaultdict
from pathlib import Path

__all__ = ["sdk_verbs"]

_SUFFIX = "_namespaced_custom_object"
_VERBS = {"create": "create", "get": "get", "list": "list", "delete": "delete", "patch": "patch",
          "replace": "update"}
_SKIPPED_DIRS = frozenset({"gke_extensions"})
"""GKE's pod-snapshot extension: not used by the server."""


def sdk_verbs() -> dict[tuple[str, str], set[str]]:
    """(group, plural) -> the verbs the SDK's calls need (a watch stream needs `list` and `watch`)."""
    spec = importlib.util.find_spec("k8s_agent_sandbox")
    assert spec is not None and spec.origin is not None, "k8s-agent-sandbox is not installed"
    root = Path(spec.origin).parent
    constants = _constants(root / "constants.py")
    verbs: dict[tuple[str, str], set[str]] = defaultdict(set)
    for path in sorted(root.rglob("*.py")):
        if _SKIPPED_DIRS & set(path.relative_to(root).parts):
            continue
        for func in ast.walk(ast.parse(path.read_text())):
            if isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                for resource, found in _function_verbs(func, constants).items():
                    verbs[resource] |= found
    return dict(verbs)


def _constants(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    values[target.id] = node.value.value
    return values


def _function_verbs(func: ast.AST, constants: dict[str, str]) -> dict[tuple[str, str], set[str]]:
    """The verbs of one function's custom-object calls, given to the one resource it names (a function naming
    calls and several resources is refused: the reading would be a guess)."""
    methods = {node.attr.removesuffix(_SUFFIX) for node in ast.walk(func)
               if isinstance(node, ast.Attribute) and node.attr.endswith(_SUFFIX)}
    if not methods:
        return {}
    watches = any(isinstance(node, ast.Attribute) and node.attr == "Watch" for node in ast.walk(func))
    names = {node.id for node in ast.walk(func) if isinstance(node, ast.Name)}
    plurals = {name for name in names if name.endswith(("_PLURAL_NAME", "_PLURAL"))}
    if len(plurals) != 1:
        name = getattr(func, "name", "?")
        raise AssertionError(f"cannot tell which resource {name} calls {sorted(methods)} on: {sorted(plurals)}")
    plural = plurals.pop()
    group = constants[plural.replace("PLURAL_NAME", "API_GROUP").replace("PLURAL", "API_GROUP")]
    verbs = {_VERBS[method] for method in methods}
    if watches:
        verbs |= {"list", "watch"}
    return {(group, constants[plural]): verbs}
