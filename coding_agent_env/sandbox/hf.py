"""The Hugging Face Sandbox backend (`hf-sandbox` SDK: HF Jobs running the SDK's small in-pod RPC server).

One HF Job per rollout (`Settings.hf_sandbox_image`, `hf_sandbox_flavor`, lifetime the rollout's deadline
plus a margin, see `SandboxSpec.lifetime_s`), or, with `Settings.hf_sandbox_url`, sandboxes made side by side on an
already running hf-sandbox server (self-hosted pods; the tests run the SDK's own server on loopback): each
sandbox then has its own root directory but shares the pod, so `isolation` says `none`.

The SDK offers only exec (argv, cwd, timeout), whole-file write and read. On top of it, the in-sandbox
launcher gives argv semantics with process-group kill at the timeout, background processes, writes that
create parents and replace symlinks, and confined reads. The SDK's exec takes no environment: each
command's environment is written as a file through the SDK's write call (an HTTP body, never a command
string) and the launcher reads and deletes it before starting the command. The SDK buffers a command's
whole output in the pod and in the client; we cap what we keep. Network policy: a pod has outbound
network whatever the policy says (`check()` declares it); `llm` is refused (no relay socket can reach a
remote pod). Orphans: a Job ends by itself at its lifetime.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import httpx
from hf_sandbox import Sandbox as HfClient

from coding_agent_env.errors import SandboxError, SandboxFileNotFoundError, SandboxUnavailableError
from coding_agent_env.sandbox import _inner
from coding_agent_env.sandbox._remote import RemoteSandbox
from coding_agent_env.sandbox.base import BackendStatus, Sandbox, SandboxBackend, SandboxSpec
from coding_agent_env.settings import Settings

__all__ = ["HfBackend", "HfSandbox"]

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

    def __init__(self, settings: Settings) -> None:
        self._settings = settings

    def check(self) -> BackendStatus:
        s = self._settings
        if s.hf_sandbox_url:
            try:
                ok = httpx.get(f"{s.hf_sandbox_url}/health", timeout=_HEALTH_TIMEOUT_S).status_code == 200
            except httpx.HTTPError as exc:
                return BackendStatus(self.name, False, None, f"hf-sandbox server unreachable: {type(exc).__name__}")
            return BackendStatus(self.name, ok, "none", f"shared hf-sandbox server at {s.hf_sandbox_url}",
                             _inner.rlimits(self._settings))
        from huggingface_hub import get_token

        if get_token() is None:
            return BackendStatus(self.name, False, None, "no Hugging Face token (HF_TOKEN or `hf auth login`)")
        return BackendStatus(self.name, True, "hf-job", f"one HF Job per rollout ({s.hf_sandbox_flavor}); pods have outbound network whatever the policy",
                             _inner.rlimits(self._settings))

    async def create(self, spec: SandboxSpec) -> Sandbox:
        s = self._settings
        if spec.network == "llm":
            raise SandboxUnavailableError("network policy 'llm' is not available on the hf backend")
        if s.hf_sandbox_url:
            token = s.hf_sandbox_token.get_secret_value() if s.hf_sandbox_token else ""
            client = HfClient("attached", s.hf_sandbox_url, token, "self-hosted")  # no HF proxy: no HF token
            safe = "".join(c for c in spec.rollout_id if c.isalnum())[:12] or "rollout"
            box = HfSandbox(s, client, f"{s.hf_sandbox_root}/{safe}-{secrets.token_hex(4)}", job=False)
        else:
            image = spec.image or s.hf_sandbox_image
            client = await _call("create HF Job", HfClient.create, image, flavor=s.hf_sandbox_flavor,
                                 timeout=f"{spec.lifetime_s(s.remote_sandbox_lifetime_s)}s")
            box = HfSandbox(s, client, _JOB_ROOT, job=True)
        return await box.installed()


class HfSandbox(RemoteSandbox):
    backend = "hf"

    def __init__(self, settings: Settings, client: HfClient, root: str, *, job: bool) -> None:
        super().__init__(settings, root)
        self._client = client
        self._job = job
        self.id = client.job_id if job else root.rsplit("/", 1)[-1]
        self.isolation = "hf-job" if job else "none"
        self.network = "host"  # a pod (or the attached server's host) has outbound network whatever the policy

    async def _run(self, argv: Sequence[str], *, env: Mapping[str, str], timeout: float | None) -> tuple[int | None, bytes, bytes]:
        limit = int(timeout if timeout is not None else self._settings.remote_sandbox_lifetime_s) + 1
        done = await _call("exec", self._client.exec, *argv, timeout=limit)
        return done.returncode, done.stdout.encode(), done.stderr.encode()

    async def _put(self, path: str, data: bytes) -> None:
        await _call("write", self._client.write_file, path, data)

    async def _get(self, path: str) -> bytes:
        data = await _call("read", self._client.read_file, path, text=False)
        assert isinstance(data, bytes)
        return data

    async def _env_args(self, token: str, env: Mapping[str, str]) -> tuple[list[str], Mapping[str, str]]:
        path = f"{self.layout.run_dir}/{token}.env"
        await self._put(path, json.dumps(dict(env)).encode())
        return ["--env-file", path], {}

    async def _close(self) -> None:
        try:
            if self._job:
                await _call("terminate HF Job", self._client.terminate)
            else:
                await self.kill_everything()
        finally:
            # The SDK has no close() for a client it did not create a Job for: close its HTTP client.
            self._client._http.close()
