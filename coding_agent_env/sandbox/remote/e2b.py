"""The E2B backend (`e2b` SDK, async): one E2B sandbox (a microVM) per rollout.

The sandbox is made from the request's image taken as an E2B template (or `E2bConfig.template`), with a
lifetime of the rollout's deadline plus a margin (`SandboxSpec.lifetime_s`; `Settings.remote_sandbox_lifetime_s`
when the spec names no deadline), so it never ends under its rollout and E2B ends one left behind by a crashed
server soon after, the rollout id in its metadata, and internet access only under network policy
`host` (operator opt-in) or `llm` through the server's public relay route (`E2B_PUBLIC_RELAY=true`; network
`llm-public`: the agent gets the public URL and its per-rollout token, never the key; CLI agents come from
`E2B_AGENTS_DIR` in the template), else `llm` is refused before anything runs. Commands run through the
in-sandbox launcher (timeouts that kill the tree, background processes, fresh verify context); their
environment travels in the SDK's `envs` (never in the command string, which holds only shell-quoted argv
and variable names); files go through the SDK's filesystem API.

The E2B cloud is unreachable from this project's CI: the backend is tested against a fake of the SDK surface
it uses (`tests/fakes/e2b_fake.py`), injected through the `sdk` argument.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import e2b

from coding_agent_env.settings.backends import E2bConfig
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
)
from coding_agent_env.settings import Settings

__all__ = ["E2bBackend", "E2bEngine"]

_USER = "user"
"""The default user of E2B templates."""


def _translate(exc: Exception, what: str) -> SandboxError:
    """The one place E2B SDK errors become ours."""
    if isinstance(exc, e2b.FileNotFoundException):
        return SandboxFileNotFoundError(f"{what}: not found")
    if isinstance(exc, e2b.AuthenticationException | e2b.SandboxNotFoundException | e2b.RateLimitException):
        return SandboxUnavailableError(f"{what}: {type(exc).__name__}")
    return SandboxError(f"{what}: {type(exc).__name__}: {exc}")


class E2bBackend(SandboxBackend):
    """`sdk`: the SDK's `AsyncSandbox` class (a fake of it in tests)."""

    name = "e2b"

    def __init__(self, config: E2bConfig, settings: Settings, sdk: Any = None) -> None:
        self._config = config
        self._settings = settings
        self._sdk = sdk if sdk is not None else e2b.AsyncSandbox

    def check(self) -> BackendStatus:
        if self._config.api_key is None:
            return BackendStatus(self.name, False, None, "no E2B API key (E2B_API_KEY)")
        return BackendStatus(self.name, True, "e2b", f"E2B template {self._config.template!r}",
                             rlimits(self._settings, nproc=False))

    def network_refusal(self, network: str) -> str | None:
        return llm_refusal(self._config, self.name, network)

    async def create(self, spec: SandboxSpec) -> Sandbox:
        c, s = self._config, self._settings
        refuse_layout(spec, self.name)
        public = check_public_relay(spec, c, self.name)
        if spec.network == "host" and not s.sandbox_allow_host_network:
            raise SandboxUnavailableError("network policy 'host' is not allowed by this server's operator")
        key = c.api_key.get_secret_value() if c.api_key else None
        try:
            vm = await self._sdk.create(
                template=spec.image or c.template,
                timeout=spec.lifetime_s(s.remote_sandbox_lifetime_s),
                metadata={"coding-agent-env.rollout": spec.rollout_id},
                allow_internet_access=spec.network == "host" or public is not None,
                api_key=key,
            )
        except e2b.SandboxException as exc:
            raise _translate(exc, "create E2B sandbox") from exc
        process_limits = (spec.limits or SandboxLimits.from_settings(s)).rlimits(nproc=False)
        # The VM's end would kill and remove everything too; tidying first keeps close deterministic.
        box = RemoteSandbox(E2bEngine(vm), f"{c.root}/{vm.sandbox_id}", backend=self.name, sandbox_id=str(vm.sandbox_id),
                            isolation="e2b", network=_network(spec.network, public),
                            timeouts=c.timeouts, rlimits=process_limits, tidy=True)
        box.relay_url = public
        box.agents_dir = c.agents_dir if spec.agents_dir is not None else None
        box.task_env = MappingProxyType(dict(spec.env))
        return await box.opened(box.install())


def _network(policy: str, public: str | None) -> str:
    if public is not None:
        return "llm-public"
    return "host" if policy == "host" else "none"


class E2bEngine(RemoteTransport):
    """An E2B VM `vm` (the SDK's `AsyncSandbox`); commands run as its default user, their environment in the
    SDK's `envs`, never in the command string (shell-quoted argv and variable names only)."""

    name = "e2b"

    def __init__(self, vm: Any) -> None:
        self._vm = vm

    async def run(self, argv: Sequence[str], *, env: Mapping[str, str], uid: int | None, out: OutputCap,
                  err: OutputCap, timeout: float | None = None, kill: bool = False) -> Ran:
        try:
            done = await self._vm.commands.run(shlex.join(argv), envs=dict(env), user=_USER, timeout=timeout or 0)
        except e2b.CommandExitException as exc:
            done = exc
        except e2b.SandboxException as exc:
            raise _translate(exc, "exec") from exc
        out.add((done.stdout or "").encode())
        err.add((done.stderr or "").encode())
        return Ran(done.exit_code)

    async def put_file(self, path: str, data: bytes) -> None:
        try:
            await self._vm.files.write(path, data, user=_USER)
        except e2b.SandboxException as exc:
            raise _translate(exc, "write") from exc

    async def read_file(self, path: str) -> bytes:
        try:
            data = await self._vm.files.read(path, format="bytes", user=_USER)
        except e2b.SandboxException as exc:
            raise _translate(exc, "read") from exc
        return bytes(data)

    async def close(self) -> None:
        try:
            await self._vm.kill()
        except e2b.SandboxException as exc:
            raise _translate(exc, "kill E2B sandbox") from exc
