"""Validators for deploy/'s objects, offline: core objects against the Kubernetes OpenAPI models of the installed
`kubernetes` client, agent-sandbox objects against their CRDs' schemas (vendored, see tests/deploy/README.md).

Both reject an unknown field, as `kubectl apply` with strict field validation (the default since 1.27) does: a
misspelt field must fail here, not be dropped silently by the API server's pruning."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes.client
import pydantic

__all__ = ["CRD_SCHEMAS", "ManifestError", "validate_object"]

CRD_SCHEMAS_FILE = Path(__file__).with_name("agent_sandbox_crd_schemas.json")
CRD_SCHEMAS: Mapping[str, dict[str, Any]] = json.loads(CRD_SCHEMAS_FILE.read_text())
"""`<group>/<version>/<kind>` -> that CRD version's openAPIV3Schema."""

_CORE_GROUPS = frozenset({"v1", "apps/v1", "rbac.authorization.k8s.io/v1", "networking.k8s.io/v1"})


class ManifestError(Exception):
    """An object of the manifests is not what the API server would accept."""


def validate_object(obj: Mapping[str, Any]) -> None:
    """Check one object; `ManifestError` naming the object and every problem found."""
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    name = f"{kind}/{obj.get('metadata', {}).get('name')}"
    if api_version in _CORE_GROUPS:
        _core(obj, name)
    elif f"{api_version}/{kind}" in CRD_SCHEMAS:
        _custom(obj, name)
    else:
        raise ManifestError(f"{name}: no schema for {api_version} {kind} (a typo, or not a kind this deployment uses)")


def _core(obj: Mapping[str, Any], name: str) -> None:
    model = _model(str(obj["apiVersion"]), str(obj["kind"]))
    try:
        # By the wire names only (the models also accept their Python names, which kubectl would not).
        model.model_validate(obj, strict=True, by_alias=True, by_name=False)
    except pydantic.ValidationError as exc:
        raise ManifestError(f"{name}: {exc}") from None


def _model(api_version: str, kind: str) -> type[pydantic.BaseModel]:
    """The client's model of `kind` (`apps/v1` Deployment -> V1Deployment), which must forbid unknown fields: a
    client release whose models let them through would make this check vacuous."""
    model = getattr(kubernetes.client, api_version.rsplit("/", 1)[-1].capitalize() + kind)
    if not (isinstance(model, type) and issubclass(model, pydantic.BaseModel)):
        raise ManifestError(f"kubernetes.client.{model!r} is not a pydantic model: cannot check {kind} strictly")
    if model.model_config.get("extra") != "forbid":
        raise ManifestError(f"kubernetes.client.{model.__name__} accepts unknown fields: cannot check {kind} strictly")
    return model


def _custom(obj: Mapping[str, Any], name: str) -> None:
    schema = _closed(CRD_SCHEMAS[f"{obj['apiVersion']}/{obj['kind']}"])
    problems = [f"{'.'.join(str(p) for p in err.absolute_path) or '(top)'}: {err.message}"
                for err in jsonschema.Draft7Validator(schema).iter_errors(obj)]
    # A CRD schema says only `type: object` of metadata: check it as the API server does, as ObjectMeta.
    try:
        kubernetes.client.V1ObjectMeta.model_validate(obj.get("metadata", {}), strict=True, by_alias=True,
                                                      by_name=False)
    except pydantic.ValidationError as exc:
        problems.append(f"metadata: {exc}")
    if problems:
        raise ManifestError(f"{name}: " + "; ".join(problems))


def _closed(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with unknown fields refused wherever the CRD lists an object's fields (the API server prunes or,
    with strict field validation, refuses them), except where it keeps unknown fields on purpose."""
    closed = copy.deepcopy(schema)
    for node in _nodes(closed):
        if ("properties" in node and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")):
            node["additionalProperties"] = False
    return closed


def _nodes(schema: Any) -> Iterator[dict[str, Any]]:
    """Every subschema, iteratively."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            yield node
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
