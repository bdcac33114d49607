"""The Kubernetes backend (`k8s-agent-sandbox` SDK, kubernetes-sigs/agent-sandbox): one `SandboxClaim` per rollout.

A sandbox is a claim on the `SandboxWarmPool` of the configured `SandboxTemplate` (`K8sConfig.template`), in
`K8sConfig.namespace`, labelled with this server's identity (`LABEL_SERVER` = `K8sConfig.server_id`) and the
rollout id, with a shutdown time of the rollout's deadline plus a margin (the controller deletes it then, if no
one did). Commands and files go through the SDK to the pod's runtime (the agent-sandbox python runtime's HTTP
API: `/execute`, `/upload`, `/download`), through the sandbox router (`K8sConfig.router_url`) or, without one,
straight to the pod's IP (in-cluster). The runtime's exec takes a command string it splits with `shlex` (never a
shell) and no environment: the argv is `shlex.join`ed, and each command's environment is written as a file
(an HTTP body) that the in-sandbox launcher reads and deletes. On top of it the launcher gives timeouts that kill
the tree, background processes, confined reads and writes that replace symlinks.

Network: whatever the policy, the pod has the network its template's NetworkPolicy gives it; the backend cannot
narrow it. `llm` runs through the server's public relay route when the operator enables it (`K8S_PUBLIC_RELAY`:
the agent gets the public URL and its per-rollout token, never the key; network `llm-public`), else it is
refused before anything runs; `none` is `none` only if the template's NetworkPolicy denies egress (said in
`check()`); `host` is refused. Limits: the pod's resources (the template's) and the launcher's rlimits.
Teardown deletes the claim, shielded from cancellation; `reap_orphans` (run before the first create) deletes the
claims a crashed server of the same identity left.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import posixpath
import re
import secrets
import shlex
import traceback
import uuid
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, TypeVar

import requests
from k8s_agent_sandbox import SandboxClient
from k8s_agent_sandbox.exceptions import SandboxError as SdkError
from k8s_agent_sandbox.exceptions import SandboxRequestError
from k8s_agent_sandbox.models import SandboxDirectConnectionConfig, SandboxInClusterConnectionConfig
from kubernetes import config as kube_config
from kubernetes.client import ApiClient, Configuration
from kubernetes.client.exceptions import ApiException
from kubernetes.config import ConfigException

from coding_agent_env.errors import SandboxError, SandboxFileNotFoundError, SandboxUnavailableError
from coding_agent_env.sandbox.base import BackendStatus, Sandbox, SandboxBackend, SandboxLimits, SandboxSpec, rlimits
from coding_agent_env.sandbox.launcher.client import OutputCap
from coding_agent_env.sandbox.launcher.transport import Ran
from coding_agent_env.sandbox.remote.base import (
    RemoteSandbox,
    RemoteTransport,
    check_public_relay,
    llm_refusal,
    refuse_layout,
    remote_layout,
)
from coding_agent_env.settings import Settings
from coding_agent_env.settings.backends import K8sConfig

__all__ = ["LABEL_LIFE", "LABEL_ROLLOUT", "LABEL_SERVER", "K8sBackend", "K8sEngine", "life"]

T = TypeVar("T")

LABEL_SERVER = "coding-agent-env/server"
"""Label on every claim: the identity of the server that made it (`K8sConfig.server_id`)."""
LABEL_LIFE = "coding-agent-env/life"
"""Label on every claim: the life (one process's run) of the server that made it; the reaper spares its own."""
LABEL_ROLLOUT = "coding-agent-env/rollout"
"""Label on every claim: its rollout id (label-safe, cut to 63 characters)."""

_REPLY_MARGIN_S = 30
"""How much longer than a command's own timeout its HTTP reply may take."""
_PLAIN_NAME = re.compile(r"[A-Za-z0-9._/-]+")
"""Paths the runtime's upload takes as they are."""
_MOVE_TIMEOUT_S = 60
"""Deadline of moving an upload into place."""
_DELETE_TIMEOUT_S = 60.0
"""Deadline of one claim deletion (teardown, reaper)."""
_REAP_TIMEOUT_S = 120.0
"""Deadline of the reaper's listing and deletions."""


async def _call(what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking SDK call in a thread (the SDK's async client needs an extra this one does not install);
    the one place its errors become ours."""
    try:
        return await asyncio.to_thread(fn, *args, **kwargs)
    except SandboxRequestError as exc:
        if exc.status_code == 404:
            raise SandboxFileNotFoundError(f"{what}: not found") from exc
        if exc.status_code is None:
            raise SandboxUnavailableError(f"{what}: the sandbox runtime is unreachable") from exc
        raise SandboxError(f"{what}: the sandbox runtime answered {exc.status_code}") from exc
    except ApiException as exc:
        raise SandboxUnavailableError(f"{what}: the Kubernetes API answered {exc.status} {exc.reason}") from exc
    except (SdkError, TimeoutError, ConfigException, requests.RequestException) as exc:
        # The SDK's frames hold the watch it abandoned (an open response): cleared, it is closed now, not
        # whenever a garbage collection reaches the exception's traceback.
        traceback.clear_frames(exc.__traceback__)
        raise SandboxUnavailableError(f"{what}: {type(exc).__name__}: {exc}") from exc
    except (OSError, ValueError, RuntimeError) as exc:  # connection failures, the SDK's malformed-reply errors
        raise SandboxError(f"{what}: {type(exc).__name__}: {exc}") from exc


def _api_client() -> ApiClient:
    """A Kubernetes API client configured by the `kubernetes` client's own rules: the pod's service account
    in-cluster, else the kubeconfig (KUBECONFIG, read now, else ~/.kube/config)."""
    configuration = Configuration()
    try:
        kube_config.load_incluster_config(client_configuration=configuration)
    except ConfigException:
        kube_config.load_kube_config(config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration)
    return ApiClient(configuration)


@functools.cache
def life() -> str:
    """This process's life: every `Backends` of one process shares it, so their reapers spare each other."""
    return secrets.token_hex(8)


def _label_value(text: str) -> str:
    """`text` as a Kubernetes label value (alphanumerics, `-_.`, at most 63, alphanumeric at both ends)."""
    safe = "".join(ch if (ch.isascii() and ch.isalnum()) or ch in "-_." else "-" for ch in text)[:63]
    return safe.strip("-_.") or "none"


class K8sBackend(SandboxBackend):
    """Sandboxes as agent-sandbox claims. Builds its SDK client on first use; `aclose` closes it."""

    name = "k8s"

    def __init__(self, config: K8sConfig, settings: Settings) -> None:
        self._config = config
        self._settings = settings
        self._client: SandboxClient[Any] | None = None
        self._api: ApiClient | None = None
        self._lock = asyncio.Lock()
        self._reaped = False

    async def _sdk(self) -> SandboxClient[Any]:
        """The SDK's client, built once (it reads the kube config: in-cluster, else KUBECONFIG)."""
        async with self._lock:
            if self._client is None:
                url = self._config.router_url
                connection = SandboxDirectConnectionConfig(api_url=url) if url else SandboxInClusterConnectionConfig()
                self._api = await _call("load the Kubernetes client configuration", _api_client)
                # cleanup=False: teardown is ours (shielded, per sandbox) and the reaper's, never an atexit hook's.
                self._client = SandboxClient(connection_config=connection, cleanup=False, api_client=self._api)
            return self._client

    def check(self) -> BackendStatus:
        c = self._config
        via = f"the sandbox router at {c.router_url}" if c.router_url else "the pods' IPs (in-cluster)"
        detail = (f"claims on SandboxTemplate {c.template!r} in namespace {c.namespace!r} through {via}; "
                  "network is the template's NetworkPolicy whatever the policy: `none` holds only if it denies "
                  "egress, `llm` needs it to allow the server's public relay route")
        return BackendStatus(self.name, True, "k8s-pod", detail, rlimits(self._settings, nproc=False))

    async def refusal(self) -> str | None:
        """Why no claim can be made: no Kubernetes configuration (neither in-cluster nor a kubeconfig)."""
        try:
            await self._sdk()
        except SandboxUnavailableError as exc:
            return str(exc)
        return None

    def network_refusal(self, network: str) -> str | None:
        if network == "host":
            return "network policy 'host' on the k8s backend: a pod's network is its template's NetworkPolicy"
        return llm_refusal(self._config, self.name, network)

    async def reap_orphans(self) -> int:
        """Delete every claim labelled with this server's identity but another life: made by an earlier life of
        this server (same `server_id`), which crashed before deleting them. Run before this backend's first
        create. So two processes running at once need distinct `server_id`s."""
        c = self._config
        selector = f"{LABEL_SERVER}={c.server_id},{LABEL_LIFE}!={life()}"
        sdk = await self._sdk()
        async with asyncio.timeout(_REAP_TIMEOUT_S):
            names = await _call("list claims", sdk.list_all_sandboxes, c.namespace, label_selector=selector)
            for name in names:
                await _call("delete claim", sdk.k8s_helper.delete_sandbox_claim, name, c.namespace,
                            _request_timeout=_DELETE_TIMEOUT_S)
        return len(names)

    async def create(self, spec: SandboxSpec) -> Sandbox:
        c, s = self._config, self._settings
        refuse_layout(spec, self.name)
        refusal = self.network_refusal(spec.network)
        if refusal is not None:
            raise SandboxUnavailableError(refusal)
        public = check_public_relay(spec, c, self.name)
        if not self._reaped:
            self._reaped = True
            await self.reap_orphans()
        sdk = await self._sdk()
        labels = {LABEL_SERVER: c.server_id, LABEL_LIFE: life(), LABEL_ROLLOUT: _label_value(spec.rollout_id)}
        claim = f"cae-{uuid.uuid4().hex[:16]}"
        # A claim we name is ours to delete whatever happens to the create. The create runs in a thread that
        # a cancellation cannot stop: the rollback waits for it (the SDK's own deadline bounds it) first.
        creating = asyncio.ensure_future(_call(
            "claim a sandbox", sdk.create_sandbox, c.template, c.namespace, sandbox_ready_timeout=c.claim_timeout_s,
            labels=labels, claim_name=claim, shutdown_after_seconds=spec.lifetime_s(s.remote_sandbox_lifetime_s)))
        try:
            async with asyncio.timeout(c.claim_timeout_s + _REPLY_MARGIN_S):
                pod = await asyncio.shield(creating)
        except BaseException:
            await asyncio.shield(self._rollback(creating, claim))
            raise
        engine = K8sEngine(pod, sdk, self._config, run_dir=remote_layout(c.root)[1].run_dir,
                           lifetime_s=s.remote_sandbox_lifetime_s)
        process_limits = (spec.limits or SandboxLimits.from_settings(s)).rlimits(nproc=False)
        box = RemoteSandbox(engine, c.root, backend=self.name, sandbox_id=pod.sandbox_id, isolation="k8s-pod",
                            network="llm-public" if public else "none", timeouts=c.timeouts,
                            rlimits=process_limits, tidy=False)
        box.relay_url = public
        box.agents_dir = c.agents_dir if spec.agents_dir is not None else None
        box.task_env = MappingProxyType(dict(spec.env))
        return await box.opened(box.install())

    async def _rollback(self, creating: asyncio.Future[Any], claim: str) -> None:
        """Delete the claim of a create that failed or was cancelled, once its thread is done."""
        with contextlib.suppress(BaseException):  # its outcome is the create's error, raised by the caller
            await creating
        sdk = await self._sdk()
        with contextlib.suppress(SandboxError):  # the create's own error is the one to raise; the reaper retries
            await _call("delete claim", sdk.k8s_helper.delete_sandbox_claim, claim, self._config.namespace,
                        _request_timeout=_DELETE_TIMEOUT_S)

    async def aclose(self) -> None:
        """Close the SDK's Kubernetes API connections (each sandbox's own connection is closed with it)."""
        async with self._lock:
            api, self._api, self._client = self._api, None, None
        if api is not None:
            # ApiClient.close() ends only its thread pool; its HTTP connections are the REST client's pool's.
            api.rest_client.pool_manager.clear()
            await asyncio.to_thread(api.close)


class K8sEngine(RemoteTransport):
    """One claimed pod through the SDK's sandbox handle `pod`. Its close deletes the claim (shielded)."""

    name = "k8s"

    def __init__(self, pod: Any, client: SandboxClient[Any], config: K8sConfig, *, run_dir: str,
                 lifetime_s: int) -> None:
        self._pod = pod
        self._claim: str | None = pod.claim_name
        self._client = client
        self._config = config
        self._run_dir = run_dir
        self._lifetime_s = lifetime_s

    def _relative(self, path: str) -> str:
        """`path` relative to the runtime's base directory, which its file calls take."""
        base = self._config.runtime_dir.rstrip("/")
        normal = posixpath.normpath(path)
        if not normal.startswith(f"{base}/"):
            raise SandboxError(f"{path!r} is outside the pod runtime's directory {base!r}")
        return normal[len(base) + 1:]

    async def run(self, argv: Sequence[str], *, env: Mapping[str, str], uid: int | None, out: OutputCap,
                  err: OutputCap, timeout: float | None = None, kill: bool = False) -> Ran:
        limit = timeout if timeout is not None else float(self._lifetime_s)
        commands = self._pod.commands
        if commands is None:
            raise SandboxError("exec: the sandbox connection is closed")
        done = await _call("exec", commands.run, shlex.join(argv), timeout=int(limit) + _REPLY_MARGIN_S,
                           command_timeout=limit)
        out.add(done.stdout.encode())
        err.add(done.stderr.encode())
        return Ran(done.exit_code)

    async def put_file(self, path: str, data: bytes) -> None:
        files = self._pod.files
        if files is None:
            raise SandboxError("write: the sandbox connection is closed")
        relative = self._relative(path)
        if _PLAIN_NAME.fullmatch(relative):
            await _call("write", files.write, relative, data)
            return
        # The runtime takes the path as a multipart filename, which clients escape (quotes become %22): any
        # other name is uploaded under a plain one and moved into place.
        staging = f"{self._run_dir}/upload-{uuid.uuid4().hex}"
        await _call("write", files.write, self._relative(staging), data)
        done = await _call("exec", self._pod.commands.run, shlex.join(["mv", "-f", "--", staging, path]),
                           timeout=_MOVE_TIMEOUT_S)
        if done.exit_code != 0:
            raise SandboxError(f"write: cannot move the upload into place: {done.stderr[-200:]}")

    async def read_file(self, path: str) -> bytes:
        files = self._pod.files
        if files is None:
            raise SandboxError("read: the sandbox connection is closed")
        return bytes(await _call("read", files.read, self._relative(path)))

    async def pass_env(self, token: str, env: Mapping[str, str]) -> tuple[list[str], Mapping[str, str]]:
        path = f"{self._run_dir}/{token}.env"
        await self.put_file(path, json.dumps(dict(env)).encode())
        return ["--env-file", path], {}

    async def close(self) -> None:
        """Close the connection and delete the claim (idempotent). Shielded: a cancelled teardown still
        deletes it, in the background."""
        await asyncio.shield(self._release())

    async def _release(self) -> None:
        try:
            await _call("close the connection", self._pod.close_connection)
            self._client.list_active_sandboxes()  # drops the closed handle from the client's table
        finally:
            if self._claim is not None:
                await _call("delete claim", self._client.k8s_helper.delete_sandbox_claim, self._claim,
                            self._config.namespace, _request_timeout=_DELETE_TIMEOUT_S)
                self._claim = None
