"""STAND-IN for a Kubernetes cluster running agent-sandbox: its API server (the CRD endpoints the SDK calls), the
agent-sandbox controller (claims bound to pods of a warm pool) and the sandbox router. No cluster runs here.

One uvicorn server on 127.0.0.1 in its own thread serves:
- the Kubernetes API for `sandboxclaims` (extensions.agents.x-k8s.io/v1beta1: create, get, list with a label
  selector, watch with a field selector, resourceVersion and timeoutSeconds, delete) and `sandboxes`
  (agents.x-k8s.io/v1beta1: get), with the wire shapes of those CRD versions (objects with uid and
  resourceVersion, `Status` errors, watch events as JSON lines), behind a bearer token (`kubeconfig` holds it);
- the sandbox router under `/router` (`X-Sandbox-ID` / `X-Sandbox-Namespace` headers, 400 and 502 with a
  `detail` body as the router documents), which proxies to the pod's runtime.
The controller binds each claim on the configured warm pool to a new Sandbox named `<pool>-<random>` (as warm
pool adoption does: not the claim's name) and marks it Ready once its pod answers; a claim on another pool gets
Ready=False `WarmPoolNotFound`. Deleting a claim deletes its Sandbox and pod.

A pod is a container on the real dockerd: the offline test image, the host's /usr read-only, `--network none`
(or the host's network: the stand-in for a NetworkPolicy that lets the pod reach the server's public relay
route), a memory and pids limit (the template's resources), uid 1000, a tmpfs as the runtime's directory; it runs
the runtime stand-in (k8s_pod_runtime.py) on a unix socket in a host directory, which the router dials.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import re
import secrets
import shutil
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.backends.rootfs import HOST_BINDS, IMAGE

CLAIMS = ("extensions.agents.x-k8s.io", "v1beta1", "sandboxclaims", "SandboxClaim")
SANDBOXES = ("agents.x-k8s.io", "v1beta1", "sandboxes", "Sandbox")
LABEL_STANDIN = "coding-agent-env.test/k8s-standin"
"""Docker label on every stand-in pod: the stand-in's id."""
LABEL_SANDBOX = "coding-agent-env.test/k8s-sandbox"
"""Docker label on every stand-in pod: its Sandbox's name."""
_RUNTIME = Path(__file__).with_name("k8s_pod_runtime.py")
_POD_READY_S = 30.0
_START_S = 15.0
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _status(code: int, reason: str, message: str) -> JSONResponse:
    """A Kubernetes `Status` error."""
    return JSONResponse({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                         "message": message, "reason": reason, "code": code}, status_code=code)


def _selects(selector: str, labels: dict[str, str]) -> bool:
    """Whether `labels` match an equality-based label selector (`k=v`, `k==v`, `k!=v`, comma-joined)."""
    for term in filter(None, selector.split(",")):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        else:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key) != value:
                return False
    return True


class K8sStandIn:
    """`with K8sStandIn(docker_client, ...) as cluster:` -> `cluster.kubeconfig`, `cluster.router_url`.

    `network`: the pods' Docker network mode (`none` or `host` only). `binds`: host paths mounted read-only at
    the same path in every pod (the image's baked-in agents). `kubeconfig`: the file to write. Exiting stops the
    server and removes every pod."""

    def __init__(self, docker: Any, *, warmpool: str = "coding-agent-env", network: str = "none",
                 binds: tuple[str, ...] = (), memory_mb: int = 1024, pids: int = 512, base_dir: str = "/app",
                 kubeconfig: Path) -> None:
        assert network in ("none", "host"), "stand-in pods never join a Docker bridge"
        self.docker, self.warmpool, self.network, self.base_dir = docker, warmpool, network, base_dir
        self.binds, self.memory_mb, self.pids = (*HOST_BINDS, *binds), memory_mb, pids
        self.id = secrets.token_hex(6)
        self.token = secrets.token_urlsafe(16)
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.sandboxes: dict[tuple[str, str], dict[str, Any]] = {}
        self.gone: dict[tuple[str, str], dict[str, Any]] = {}
        self._sockets: dict[str, str] = {}
        """Sandbox name -> its pod runtime's socket (what the router's name index resolves to)."""
        self.commands: list[str] = []
        """Every command string the router passed to a pod's `/execute`."""
        self.created: list[dict[str, Any]] = []
        """Every claim as it was created (the wire body the SDK sent)."""
        self._rv = 0
        self._changed: asyncio.Condition | None = None
        self._dir = Path(tempfile.mkdtemp(prefix="cae-k8s-"))
        os.chmod(self._dir, 0o755)
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.kubeconfig = kubeconfig
        """Where the stand-in writes a kubeconfig of itself (bearer token included) as it starts."""
        app = Starlette(routes=[
            Route("/router/{path:path}", self._route, methods=["GET", "POST", "PUT", "DELETE", "HEAD"]),
            Route("/apis/{group}/{version}/namespaces/{ns}/{plural}", self._collection, methods=["GET", "POST"]),
            Route("/apis/{group}/{version}/namespaces/{ns}/{plural}/{name}", self._item, methods=["GET", "DELETE"]),
        ])
        config = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False,
                                timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    @property
    def router_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/router"

    def __enter__(self) -> K8sStandIn:
        self.kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "standin",
            "clusters": [{"name": "standin", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
            "users": [{"name": "standin", "user": {"token": self.token}}],
            "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "standin"}}]}))
        self._thread.start()
        deadline = time.monotonic() + _START_S
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                self.close()
                raise AssertionError("the Kubernetes stand-in did not start")
            time.sleep(0.01)  # polling the server thread's start flag, with a deadline
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=_START_S)
        self._sock.close()
        for container in self.pods():
            container.remove(force=True)
        shutil.rmtree(self._dir, ignore_errors=True)

    def pods(self) -> list[Any]:
        """This stand-in's live pods (Docker containers)."""
        return self.docker.containers.list(all=True, filters={"label": f"{LABEL_STANDIN}={self.id}"})

    def claim_names(self) -> list[str]:
        return sorted(name for _, name in self.claims)

    def add_claim(self, name: str, labels: dict[str, str]) -> None:
        """Make a bound claim as another client would (a crashed server's, for the reaper's tests)."""
        body = {"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
                "metadata": {"name": name, "labels": labels}, "spec": {"warmPoolRef": {"name": self.warmpool}}}
        url = f"http://127.0.0.1:{self.port}/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/default/sandboxclaims"
        httpx.post(url, json=body, headers={"Authorization": f"Bearer {self.token}"}).raise_for_status()
        deadline = time.monotonic() + _POD_READY_S
        while not self.claims[("default", name)]["status"].get("sandbox"):
            assert time.monotonic() < deadline, f"the stand-in did not bind claim {name}"
            time.sleep(0.02)  # polling the controller's binding, with a deadline

    # -- the API server --------------------------------------------------------------------------------

    def _authorized(self, request: Request) -> bool:
        return request.headers.get("authorization") == f"Bearer {self.token}"

    async def _bump(self, obj: dict[str, Any]) -> None:
        if self._changed is None:
            self._changed = asyncio.Condition()
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        async with self._changed:
            self._changed.notify_all()

    async def _collection(self, request: Request) -> Response:
        if not self._authorized(request):
            return _status(401, "Unauthorized", "Unauthorized")
        p = request.path_params
        kind = (p["group"], p["version"], p["plural"])
        if kind != CLAIMS[:3]:
            return _status(404, "NotFound", f"the server could not find the requested resource {kind}")
        if request.method == "POST":
            return await self._create_claim(p["ns"], await request.json())
        q = request.query_params
        if q.get("watch") in ("true", "1", "True"):
            return StreamingResponse(self._watch(p["ns"], q), media_type="application/json")
        items = [c for (ns, _), c in self.claims.items()
                 if ns == p["ns"] and _selects(q.get("labelSelector", ""), c["metadata"].get("labels") or {})]
        return JSONResponse({"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaimList",
                             "metadata": {"resourceVersion": str(self._rv)}, "items": items})

    async def _create_claim(self, ns: str, body: dict[str, Any]) -> JSONResponse:
        name = body.get("metadata", {}).get("name", "")
        if body.get("kind") != CLAIMS[3] or body.get("apiVersion") != f"{CLAIMS[0]}/{CLAIMS[1]}":
            return _status(400, "BadRequest", "not a SandboxClaim of extensions.agents.x-k8s.io/v1beta1")
        if not _DNS_LABEL.match(name):
            return _status(422, "Invalid", f"invalid claim name {name!r}")
        if (ns, name) in self.claims:
            return _status(409, "AlreadyExists", f'sandboxclaims "{name}" already exists')
        self.created.append(copy.deepcopy(body))
        claim = copy.deepcopy(body)
        claim["metadata"].update(namespace=ns, uid=str(uuid.uuid4()), generation=1,
                                 creationTimestamp=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        claim["status"] = {}
        self.claims[(ns, name)] = claim
        await self._bump(claim)
        asyncio.ensure_future(self._bind(ns, name))
        return JSONResponse(claim, status_code=201)

    async def _bind(self, ns: str, claim_name: str) -> None:
        """The controller: a pod for the claim, then its Sandbox and the claim's status, Ready."""
        claim = self.claims.get((ns, claim_name))
        if claim is None:
            return
        if claim["spec"].get("warmPoolRef", {}).get("name") != self.warmpool:
            claim["status"] = {"conditions": [{"type": "Ready", "status": "False", "reason": "WarmPoolNotFound",
                                               "message": "SandboxWarmPool not found"}]}
            return await self._bump(claim)
        name = f"{self.warmpool}-{secrets.token_hex(3)}"
        sock = await asyncio.to_thread(self._start_pod, name)
        deadline = time.monotonic() + _POD_READY_S
        while not os.path.exists(sock):
            if time.monotonic() > deadline:
                return
            await asyncio.sleep(0.02)  # the controller polls its pod's readiness, with a deadline
        if (ns, claim_name) not in self.claims:  # deleted meanwhile
            await asyncio.to_thread(self._remove_pod, name)
            return
        ready = [{"type": "Ready", "status": "True", "reason": "DependenciesReady", "message": ""}]
        self._sockets[name] = sock
        self.sandboxes[(ns, name)] = {
            "apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
            "metadata": {"name": name, "namespace": ns, "uid": str(uuid.uuid4()), "annotations": {}},
            "status": {"conditions": ready, "replicas": 1}}
        claim["status"] = {"sandbox": {"name": name}, "conditions": ready}
        await self._bump(claim)

    def _start_pod(self, name: str) -> str:
        sock_dir = self._dir / name
        sock_dir.mkdir()
        os.chmod(sock_dir, 0o777)
        volumes = {str(_RUNTIME.parent): {"bind": "/standin/code", "mode": "ro"},
                   str(sock_dir): {"bind": "/standin/sock", "mode": "rw"},
                   **{path: {"bind": path, "mode": "ro"} for path in self.binds}}
        self.docker.containers.run(
            IMAGE, ["python3", "-I", f"/standin/code/{_RUNTIME.name}", "/standin/sock/runtime.sock", self.base_dir],
            detach=True, network_mode=self.network, user="1000:1000", volumes=volumes, working_dir="/",
            tmpfs={self.base_dir: "rw,exec,mode=1777,size=1g"}, mem_limit=f"{self.memory_mb}m",
            memswap_limit=f"{self.memory_mb}m", pids_limit=self.pids, environment={"PATH": "/usr/bin:/bin"},
            labels={LABEL_STANDIN: self.id, LABEL_SANDBOX: name}, name=f"cae-k8s-{self.id}-{name}")
        return str(sock_dir / "runtime.sock")

    def _remove_pod(self, name: str) -> None:
        for container in self.docker.containers.list(all=True, filters={"label": f"{LABEL_SANDBOX}={name}"}):
            container.remove(force=True)

    async def _watch(self, ns: str, q: Any) -> AsyncIterator[bytes]:
        name = q.get("fieldSelector", "").removeprefix("metadata.name=")
        deadline = time.monotonic() + float(q.get("timeoutSeconds") or 60)
        seen = int(q.get("resourceVersion") or 0)
        if self._changed is None:
            self._changed = asyncio.Condition()
        while time.monotonic() < deadline:
            version = self._rv
            obj = self.claims.get((ns, name))
            if obj is None and (ns, name) in self.gone:
                yield json.dumps({"type": "DELETED", "object": self.gone[(ns, name)]}).encode() + b"\n"
                return
            if obj is not None and int(obj["metadata"]["resourceVersion"]) > seen:
                kind = "ADDED" if seen == 0 else "MODIFIED"
                seen = int(obj["metadata"]["resourceVersion"])
                yield json.dumps({"type": kind, "object": obj}).encode() + b"\n"
            async with self._changed:
                try:
                    await asyncio.wait_for(self._changed.wait_for(lambda: self._rv != version),
                                           max(0.0, deadline - time.monotonic()))
                except TimeoutError:
                    return

    async def _item(self, request: Request) -> Response:
        if not self._authorized(request):
            return _status(401, "Unauthorized", "Unauthorized")
        p = request.path_params
        kind, key = (p["group"], p["version"], p["plural"]), (p["ns"], p["name"])
        store = {CLAIMS[:3]: self.claims, SANDBOXES[:3]: self.sandboxes}.get(kind)
        if store is None:
            return _status(404, "NotFound", f"the server could not find the requested resource {kind}")
        obj = store.get(key)
        if obj is None:
            return _status(404, "NotFound", f'{p["plural"]} "{p["name"]}" not found')
        if request.method == "GET":
            return JSONResponse(obj)
        if store is not self.claims:
            return _status(405, "MethodNotAllowed", "sandboxes are the controller's")
        # The real controller removes the pod after the claim is gone; here first, so a claim listed as gone
        # has no pod left behind (what the tests check).
        sandbox = obj.get("status", {}).get("sandbox", {}).get("name")
        if sandbox:
            self.sandboxes.pop((p["ns"], sandbox), None)
            await asyncio.to_thread(self._remove_pod, sandbox)
        self.claims.pop(key, None)
        obj["metadata"]["deletionTimestamp"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.gone[key] = obj
        await self._bump(obj)
        return JSONResponse(obj)

    # -- the sandbox router ------------------------------------------------------------------------------

    async def _route(self, request: Request) -> Response:
        sandbox_id = request.headers.get("x-sandbox-id")
        ns = request.headers.get("x-sandbox-namespace", "default")
        if not sandbox_id:
            return JSONResponse({"detail": "X-Sandbox-ID header is required."}, status_code=400)
        if not _DNS_LABEL.match(sandbox_id) or len(sandbox_id) > 63:
            return JSONResponse({"detail": "Invalid sandbox ID format."}, status_code=400)
        if not _DNS_LABEL.match(ns):
            return JSONResponse({"detail": "Invalid namespace format."}, status_code=400)
        sandbox = self.sandboxes.get((ns, sandbox_id))
        if sandbox is None:
            return JSONResponse({"detail": f"Could not connect to the backend sandbox: {sandbox_id}"},
                                status_code=502)
        timeout = float(request.headers.get("x-sandbox-timeout") or 600)
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() in ("content-type", "accept")}
        url = f"http://pod/{request.path_params['path']}"
        if request.url.query:
            url += f"?{request.url.query}"
        body = await request.body()
        if request.path_params["path"] == "execute":
            self.commands.append(json.loads(body).get("command", ""))
        transport = httpx.AsyncHTTPTransport(uds=self._sockets[sandbox_id])
        try:
            async with httpx.AsyncClient(transport=transport, timeout=timeout) as client:
                reply = await client.request(request.method, url, content=body, headers=headers)
        except httpx.HTTPError:
            return JSONResponse({"detail": f"Could not connect to the backend sandbox: {sandbox_id}"},
                                status_code=502)
        return Response(reply.content, status_code=reply.status_code,
                        media_type=reply.headers.get("content-type"))
