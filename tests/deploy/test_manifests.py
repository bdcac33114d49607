"""deploy/, offline: the kustomization lists every manifest (and renders to exactly those objects where kubectl is
installed), every object passes the Kubernetes models or its agent-sandbox CRD schema (unknown fields refused),
and the objects agree with each other and with the package (setting names, Secret refs, selectors, the RBAC the
SDK needs, the sandbox network). What a real cluster must still check is in docs/how-to/deploy-kubernetes.md."""

from __future__ import annotations

import copy
import shutil
import subprocess
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml

from coding_agent_env.settings import PUBLIC_RELAY_PATH, Settings
from coding_agent_env.settings.backends import BACKEND_KINDS
from tests.deploy.sdk_calls import sdk_verbs
from tests.deploy.validate import ManifestError, validate_object

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
BASE = DEPLOY / "base"
GVISOR = DEPLOY / "overlays" / "gvisor"
RENDER_TIMEOUT_S = 60.0

Obj = dict[str, Any]


def listed(directory: Path) -> list[str]:
    return list(yaml.safe_load((directory / "kustomization.yaml").read_text())["resources"])


def load(directory: Path = BASE) -> list[Obj]:
    """The objects the kustomization applies, by a plain YAML load of each file it lists."""
    return [doc for name in listed(directory) for doc in yaml.safe_load_all((directory / name).read_text()) if doc]


def by_kind(objects: list[Obj], kind: str) -> list[Obj]:
    return [obj for obj in objects if obj["kind"] == kind]


def one(objects: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = [obj for obj in by_kind(objects, kind) if name is None or obj["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def key(obj: Obj) -> tuple[str, str, str]:
    return obj["apiVersion"], obj["kind"], obj["metadata"]["name"]


def render(directory: Path) -> list[Obj]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the plain load of the listed files is what is checked")
    out = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, check=True,
                         timeout=RENDER_TIMEOUT_S).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


# --- the kustomization ------------------------------------------------------------------------------------------

def test_the_kustomization_lists_every_manifest_and_only_existing_ones() -> None:
    names = listed(BASE)
    assert len(names) == len(set(names)), "a file listed twice"
    on_disk = {path.name for path in BASE.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(names) == on_disk, f"listed but missing: {set(names) - on_disk}; not listed: {on_disk - set(names)}"


def test_kustomize_renders_exactly_the_listed_files() -> None:
    rendered = sorted(render(BASE), key=key)
    assert rendered == sorted(load(), key=key)


def test_the_gvisor_overlay_only_adds_the_runtime_class() -> None:
    base = {key(obj): obj for obj in render(BASE)}
    overlay = {key(obj): obj for obj in render(GVISOR)}
    assert overlay.keys() == base.keys()
    template = overlay[("extensions.agents.x-k8s.io/v1beta1", "SandboxTemplate", "coding-agent-env-sandbox")]
    assert template["spec"]["podTemplate"]["spec"].pop("runtimeClassName") == "gvisor"
    assert overlay == base
    validate_object(template)


# --- schemas ----------------------------------------------------------------------------------------------------

def objects() -> list[Any]:
    return [pytest.param(obj, id="-".join(key(obj)[1:])) for obj in load()]


@pytest.mark.parametrize("obj", objects())
def test_every_object_passes_its_schema(obj: Obj) -> None:
    validate_object(obj)


def test_the_secret_example_passes_its_schema_and_holds_only_placeholders() -> None:
    secret = yaml.safe_load((DEPLOY / "secrets.example.yaml").read_text())
    validate_object(secret)
    assert set(secret["stringData"].values()) == {"REPLACE_ME"}


def test_both_kinds_of_object_are_checked() -> None:
    kinds = {obj["kind"] for obj in load()}
    assert {"Deployment", "Service", "Role", "NetworkPolicy", "SandboxTemplate", "SandboxWarmPool"} <= kinds


@pytest.mark.parametrize(("kind", "path", "value"), [
    ("Deployment", ["spec", "replica"], 2),  # replicas, misspelt
    ("Deployment", ["spec", "template", "spec", "containers", 0, "containerPorts"], []),
    ("Deployment", ["spec", "replicas"], "two"),
    ("Service", ["spec", "sessionAffinty"], "ClientIP"),
    ("NetworkPolicy", ["spec", "policyType"], ["Egress"]),
    ("SandboxTemplate", ["spec", "podTemplat"], {}),
    ("SandboxTemplate", ["spec", "podTemplate", "spec", "containers", 0, "resource"], {}),
    ("SandboxTemplate", ["spec", "networkPolicyManagement"], "Off"),
    ("SandboxWarmPool", ["spec", "sandboxTemplateRef", "nam"], "x"),
    ("SandboxWarmPool", ["metadata", "labelz"], {}),
])
def test_a_misspelt_or_mistyped_field_is_refused(kind: str, path: list[Any], value: Any) -> None:
    obj = copy.deepcopy(by_kind(load(), kind)[0])
    node = obj
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    with pytest.raises(ManifestError):
        validate_object(obj)


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(ManifestError, match="no schema"):
        validate_object({"apiVersion": "extensions.agents.x-k8s.io/v1alpha2", "kind": "SandboxTemplate",
                         "metadata": {"name": "x"}, "spec": {}})


# --- the objects agree ------------------------------------------------------------------------------------------

def server_container(objs: list[Obj]) -> Obj:
    containers = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def setting_names() -> set[str]:
    """Every environment variable the package reads as a setting."""
    names = {field.upper() for field in Settings.model_fields if field != "backends"} | {"SANDBOX_BACKENDS"}
    for model in BACKEND_KINDS.values():
        names |= set(model.ENV.values())
    return names


def server_environment(objs: list[Obj]) -> dict[str, Obj]:
    """Variable -> its source (`{"value": ...}`, `{"valueFrom": ...}`, `{"configMap": name}`) in the server pod."""
    container = server_container(objs)
    env: dict[str, Obj] = {}
    for source in container.get("envFrom", []):
        data = one(objs, "ConfigMap", source["configMapRef"]["name"])["data"]
        env.update({name: {"configMap": data[name]} for name in data})
    for item in container["env"]:
        assert item["name"] not in env, f"{item['name']} set twice"
        env[item["name"]] = {k: v for k, v in item.items() if k != "name"}
    return env


HELPERS = {"POD_IP"}
"""Variables that are not settings but only feed others (`$(POD_IP)` in RELAY_PUBLIC_URL)."""


def k8s_registered() -> bool:
    return "k8s" in BACKEND_KINDS


def test_every_variable_the_server_gets_is_a_setting_it_reads() -> None:
    env = server_environment(load())
    unknown = set(env) - setting_names() - HELPERS
    if not k8s_registered():
        pending = {name for name in unknown if name.startswith("K8S_")}
        unknown -= pending
    assert not unknown, f"not settings of this package: {sorted(unknown)}"
    used = {name for name in HELPERS for source in env.values() if f"$({name})" in str(source.get("value", ""))}
    assert used == HELPERS & set(env), "a helper variable nothing refers to"


@pytest.mark.skipif(not k8s_registered(), reason="the k8s backend is not registered in settings yet")
def test_the_k8s_variables_are_the_k8s_backends() -> None:
    env = server_environment(load())
    k8s_env = set(BACKEND_KINDS["k8s"].ENV.values())
    assert {name for name in env if name.startswith("K8S_")} <= k8s_env


def test_the_server_runs_the_k8s_backend_only_bound_to_all_interfaces() -> None:
    env = server_environment(load())
    assert env["SANDBOX_BACKENDS"]["configMap"] == "k8s"
    assert env["HOST"]["configMap"] not in {"127.0.0.1", "localhost", "::1"}
    assert env["RESULTS_FROM_SERVER"]["configMap"] == "true"
    assert "K8S_SERVER_ID" in env and env["K8S_SERVER_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def test_secrets_come_from_secret_refs_that_exist() -> None:
    objs = load()
    env = server_environment(objs)
    secret = yaml.safe_load((DEPLOY / "secrets.example.yaml").read_text())
    secret_settings = {name.upper() for name, field in Settings.model_fields.items()
                       if "SecretStr" in str(field.annotation)}
    refs = {name: source["valueFrom"]["secretKeyRef"] for name, source in env.items()
            if "secretKeyRef" in source.get("valueFrom", {})}
    for name in secret_settings & set(env):
        assert name in refs, f"{name} is a secret setting but the pod gets it as a literal"
    assert "RESULTS_DB" in refs and not refs["RESULTS_DB"].get("optional", False)
    for name, ref in refs.items():
        assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["stringData"], name
    assert not by_kind(objs, "Secret"), "a Secret applied from the repository would hold literal values"


def test_the_relay_route_is_the_replicas_own_address() -> None:
    objs = load()
    env = server_environment(objs)
    url = urllib.parse.urlsplit(env["RELAY_PUBLIC_URL"]["value"])
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert url.hostname == "$(pod_ip)" and url.path == PUBLIC_RELAY_PATH
    ports = {port["containerPort"] for port in server_container(objs)["ports"]}
    assert url.port in ports and str(url.port) == env["PORT"]["configMap"]


def test_services_and_ingress_reach_the_server_pods() -> None:
    objs = load()
    deployment = one(objs, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    port_names = {port["name"] for port in server_container(objs)["ports"]}
    services = {svc["metadata"]["name"]: svc for svc in by_kind(objs, "Service")}
    for service in services.values():
        assert service["spec"]["selector"].items() <= labels.items(), service["metadata"]["name"]
        assert {port["targetPort"] for port in service["spec"]["ports"]} <= port_names
    assert services["coding-agent-env"]["spec"]["sessionAffinity"] == "ClientIP"
    backends = [path["backend"]["service"] for rule in one(objs, "Ingress")["spec"]["rules"]
                for path in rule["http"]["paths"]]
    assert all(b["name"] in services and b["port"]["name"] in port_names for b in backends)


def role_verbs(role: Obj) -> dict[tuple[str, str], set[str]]:
    verbs: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                verbs.setdefault((group, resource), set()).update(rule["verbs"])
    return verbs


GATEWAYS = ("gateway.networking.k8s.io", "gateways")
"""Only the SDK's gateway mode reads Gateways; the server is given the sandbox router's URL instead."""


def rbac_problems(role: Obj) -> list[str]:
    needed = {resource: verbs for resource, verbs in sdk_verbs().items() if resource != GATEWAYS}
    granted = role_verbs(role)
    problems = [f"{resource}: missing {sorted(verbs - granted.get(resource, set()))}"
                for resource, verbs in needed.items() if verbs - granted.get(resource, set())]
    problems += [f"{resource}: more than the SDK calls: {sorted(verbs - needed.get(resource, set()))}"
                 for resource, verbs in granted.items() if verbs - needed.get(resource, set())]
    return problems


def test_the_role_grants_exactly_what_the_sdk_calls() -> None:
    needed = sdk_verbs()
    assert ("extensions.agents.x-k8s.io", "sandboxclaims") in needed and ("agents.x-k8s.io", "sandboxes") in needed
    assert rbac_problems(one(load(), "Role")) == []


@pytest.mark.parametrize("change", ["drop delete", "add pods"])
def test_a_role_short_of_or_beyond_the_sdk_is_caught(change: str) -> None:
    role = copy.deepcopy(one(load(), "Role"))
    if change == "drop delete":
        role["rules"][0]["verbs"].remove("delete")
    else:
        role["rules"].append({"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]})
    assert rbac_problems(role)


def test_the_server_runs_as_the_bound_service_account() -> None:
    objs = load()
    account = one(objs, "ServiceAccount")["metadata"]["name"]
    binding = one(objs, "RoleBinding")
    assert one(objs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == account
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": one(objs, "Role")["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": "coding-agent-env"}]


def test_the_template_the_server_claims_is_the_warm_pools_and_its_resources_are_the_limits() -> None:
    objs = load()
    env = server_environment(objs)
    template = one(objs, "SandboxTemplate")
    pool = one(objs, "SandboxWarmPool")
    name = env["K8S_SANDBOX_TEMPLATE"]["configMap"]
    assert template["metadata"]["name"] == name == pool["spec"]["sandboxTemplateRef"]["name"]
    assert pool["metadata"]["name"] == name  # claims name the warm pool of the template's name
    pod = template["spec"]["podTemplate"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    resources = container["resources"]
    assert resources["requests"] == resources["limits"]
    expected = {"cpu": env["SANDBOX_CPUS"]["configMap"], "memory": f"{env['SANDBOX_MEMORY_MB']['configMap']}Mi",
                "ephemeral-storage": f"{env['SANDBOX_DISK_MB']['configMap']}Mi"}
    assert resources["limits"] == expected
    assert template["spec"]["networkPolicyManagement"] == "Unmanaged", "our NetworkPolicy, not the controller's"


def selects(policy: Obj, labels: dict[str, str]) -> bool:
    return policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()


def test_sandboxes_may_only_reach_dns_and_the_servers_relay_port() -> None:
    objs = load()
    sandbox_labels = one(objs, "SandboxTemplate")["spec"]["podTemplate"]["metadata"]["labels"]
    server_labels = one(objs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    policies = [policy for policy in by_kind(objs, "NetworkPolicy") if selects(policy, sandbox_labels)]
    assert len(policies) == 1 and not selects(policies[0], server_labels)
    spec = policies[0]["spec"]
    assert set(spec["policyTypes"]) == {"Ingress", "Egress"}
    relay_port = urllib.parse.urlsplit(server_environment(objs)["RELAY_PUBLIC_URL"]["value"]).port
    for rule in spec["egress"]:
        assert rule.get("to"), "an egress rule open to every destination"
        for peer in rule["to"]:
            assert "ipBlock" not in peer
            if peer["podSelector"]["matchLabels"].items() <= server_labels.items():
                assert "namespaceSelector" not in peer
                assert [(p["protocol"], p["port"]) for p in rule["ports"]] == [("TCP", relay_port)]
            else:
                assert peer["podSelector"]["matchLabels"] == {"k8s-app": "kube-dns"}
                assert {p["port"] for p in rule["ports"]} == {53}
    runtime_ports = {p["containerPort"] for c in one(objs, "SandboxTemplate")["spec"]["podTemplate"]["spec"]
                     ["containers"] for p in c.get("ports", [])}
    assert {p["port"] for rule in spec["ingress"] for p in rule["ports"]} <= runtime_ports


def test_the_server_pods_have_their_own_network_policy() -> None:
    objs = load()
    server_labels = one(objs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    (policy,) = [p for p in by_kind(objs, "NetworkPolicy") if selects(p, server_labels)]
    assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    ports = {port["containerPort"] for port in server_container(objs)["ports"]}
    assert {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]} == ports
