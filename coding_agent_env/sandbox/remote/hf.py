"""The Hugging Face Sandbox backend (`hf-sandbox` SDK: HF Jobs running the SDK's small in-pod RPC server).

One HF Job per rollout (`HfConfig.image`, `HfConfig.flavor`, lifetime the rollout's deadline plus a margin,
see `SandboxSpec.lifetime_s`), or, with `HfConfig.url`, sandboxes made side by side on an
already running hf-sandbox server (self-hosted pods; the tests run the SDK's own server on loopback): each
sandbox then has its own root directory but shares the pod, so `isolation` says `none`.

The SDK offers only exec (argv, cwd, timeout), whole-file write and read. On top of it, the in-sandbox
launcher gives argv semantics with process-group kill at the timeout, background processes, writes that
create parents and replace symlinks, and confined reads. The SDK's exec takes no environment: each
command's environment is written as a file through the SDK's write call (an HTTP body, never a command
string) and the launcher reads and deletes it before starting the command. The SDK buffers a command's
whole output in the pod and in the client; we cap what we keep. Network policy: a pod has outbound
network whatever the policy says (`check()` declares it). `llm` runs through the server's public relay route
when the operator enables it (`HF_SANDBOX_PUBLIC_RELAY=true`; network `llm-public`: the agent gets the public
URL and its per-rollout token, never the key; CLI agents come from `HF_SANDBOX_AGENTS_DIR` in the pod), else it
is refused before anything runs. Orphans: a Job ends by itself at its lifetime.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, TypeVar

import httpx
from hf_sandbox import Sandbox as HfClient

from coding_agent_env.settings.backends import HfConfig
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

__all__ = ["HfBackend", "HfEngine"]

T = TypeVar("T")

_JOB_ROOT = "/sandbox"
_HEALTH_TIMEOUT_S = 5.0


async def _call(what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking SDK call in a thread; the one place its errors become ours."""
    try:
        return await asyncio.to_thread(fn, *args, **kwargs)
    except FileNotFoundError as exc:
        raise SandboxFileNotFoundError(f"{what}: not found") from exc
    except httpx.HTTPStatusError as exc:
        raise SandboxError(f"{what}: the sandbox server answered {exc.response.status_code}") from exc
    except (httpx.HTTPError, TimeoutError) as exc:
        raise SandboxUnavailableError(f"{what}: sandbox server unreachable ({type(exc).__name__})") from exc
    except RuntimeError as exc:  # the SDK's "No HF token found"
        raise SandboxUnavailableError(f"{what}: {exc}") from exc


class HfBackend(SandboxBackend):
    name = "hf"

    def __init__(self, config: HfConfig, settings: Settings) -> None:
        self._config = config
        self._settings = settings

    def check(self) -> BackendStatus:
        c = self._config
        limits = rlimits(self._settings, nproc=False)
        if c.url:
            try:
                ok = httpx.get(f"{c.url}/health", timeout=_HEALTH_TIMEOUT_S).status_code == 200
            except httpx.HTTPError as exc:
                return BackendStatus(self.name, False, None, f"hf-sandbox server unreachable: {type(exc).__name__}")
            return BackendStatus(self.name, ok, "none", f"shared hf-sandbox server at {c.url}", limits)
        from huggingface_hub import get_token

        if get_token() is None:
            return BackendStatus(self.name, False, None, "no Hugging Face token (HF_TOKEN or `hf auth login`)")
        detail = f"one HF Job per rollout ({c.flavor}); pods have outbound network whatever the policy"
        return BackendStatus(self.name, True, "hf-job", detail, limits)

    def network_refusal(self, network: str) -> str | None:
        return llm_refusal(self._config, self.name, network)

    async def create(self, spec: SandboxSpec) -> Sandbox:
        c, s = self._config, self._settings
        refuse_layout(spec, self.name)
        public = check_public_relay(spec, c, self.name)
        if c.url:
            token = c.token.get_secret_value() if c.token else ""
            sdk = HfClient("attached", c.url, token, "self-hosted")  # no HF proxy: no HF token
            safe = "".join(ch for ch in spec.rollout_id if ch.isalnum())[:12] or "rollout"
            root, job = f"{c.root}/{safe}-{secrets.token_hex(4)}", False
            sandbox_id = root.rsplit("/", 1)[-1]
        else:
            sdk = await _call("create HF Job", HfClient.create, spec.image or c.image, flavor=c.flavor,
                              timeout=f"{spec.lifetime_s(s.remote_sandbox_lifetime_s)}s")
            root, job, sandbox_id = _JOB_ROOT, True, sdk.job_id
        engine = HfEngine(sdk, job=job, run_dir=remote_layout(root)[1].run_dir, lifetime_s=s.remote_sandbox_lifetime_s)
        process_limits = (spec.limits or SandboxLimits.from_settings(s)).rlimits(nproc=False)
        # A pod (or the attached server's host) has outbound network whatever the policy.
        box = RemoteSandbox(engine, root, backend=self.name, sandbox_id=sandbox_id,
                            isolation="hf-job" if job else "none", network="llm-public" if public else "host",
                            timeouts=c.timeouts, rlimits=process_limits, tidy=not job)
        box.relay_url = public
        box.agents_dir = c.agents_dir if spec.agents_dir is not None else None
        box.task_env = MappingProxyType(dict(spec.env))
        return await box.opened(box.install())


class HfEngine(RemoteTransport):
    """An HF Job, or a root on a shared hf-sandbox server, through the SDK's client `sdk`. The SDK's exec takes
    no environment: it goes to the launcher in a file under `run_dir`, written through the SDK."""

    name = "hf"

    def __init__(self, sdk: HfClient, *, job: bool, run_dir: str, lifetime_s: int) -> None:
        self._sdk = sdk
        self._job = job
        self._run_dir = run_dir
        self._lifetime_s = lifetime_s

    async def run(self, argv: Sequence[str], *, env: Mapping[str, str], uid: int | None, out: OutputCap,
                  err: OutputCap, timeout: float | None = None, kill: bool = False) -> Ran:
        limit = int(timeout if timeout is not None else self._lifetime_s) + 1
        done = await _call("exec", self._sdk.exec, *argv, timeout=limit)
        out.add(done.stdout.encode())
        err.add(done.stderr.encode())
        return Ran(done.returncode)

    async def put_file(self, path: str, data: bytes) -> None:
        await _call("write", self._sdk.write_file, path, data)

    async def read_file(self, path: str) -> bytes:
        data = await _call("read", self._sdk.read_file, path, text=False)
        assert isinstance(data, bytes)
        return data

    async def pass_env(self, token: str, env: Mapping[str, str]) -> tuple[list[str], Mapping[str, str]]:
        path = f"{self._run_dir}/{token}.env"
        await self.put_file(path, json.dumps(dict(env)).encode())
        return ["--env-file", path], {}

    async def close(self) -> None:
        try:
            if self._job:
                await _call("terminate HF Job", self._sdk.terminate)
        finally:
            # The SDK has no close() for a client it did not create a Job for: close its HTTP client.
            self._sdk._http.close()
