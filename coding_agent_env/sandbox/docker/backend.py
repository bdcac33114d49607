"""The Docker backend: one container per rollout, driven through the `docker` SDK (sync, run in threads).

Each sandbox is a container of the request's image (or `DockerConfig.image`), labelled with the rollout id and
the owning server (`host/pid`, see `reaper`), with the network policy's network (`none` by default; `host`
only when `Settings.sandbox_allow_host_network`; `llm` = no network plus the relay's unix socket bind-mounted
and the LLM forwarder started inside once, so processes reach the relay at `relay_url`), the sandbox's limits
(`SandboxLimits`: memory, processes and CPUs of the container as a whole; disk through `storage_opt` where the
engine's storage driver supports a size, else a tmpfs of the disk budget at the workdir, whose pages count
against the container's memory, so that is raised by the budget), all capabilities dropped but the few its
root-run launcher needs (with `SandboxSpec.users`, those Docker gives a default container: its root commands'),
and `no-new-privileges`.

Where things are (`layout.SandboxLayout`): the workdir at `/workspace`, or at the spec's `workdir` (`/app`); the
task's further roots (`SandboxSpec.writable_roots`: `/solution`, `/queries`) as directories of the sandbox user;
`/tests` only with `SandboxSpec.tests`. With a sized writable layer they are directories in it (the image's files
there stay visible, all within the layer's size). Without one, each is a tmpfs volume of the disk budget (the
workdir is the budget, as at `/workspace`; the further roots' pages are charged to the container's memory with
the workdir's, which is raised by one budget only: together they are bounded by memory plus budget, not by the
budget alone), and what the image holds there is copied onto it (`seed`: a tmpfs volume would hide it).

Every command runs through the in-container launcher (`DockerSandbox`, a `LauncherSandbox`): as uid 1000, in
its own session, under a child subreaper so the whole tree is killed at the timeout, on cancellation, or when
it exits. How commands reach the launcher is the backend's transport, chosen once from `DockerConfig.transport`:
`control` (a socket to PID 1, for a daemon on this host) or `exec` (the engine's exec API, any daemon); see
`control` and `engine_exec`. Either way the environment travels outside any argv.

Groups (`snapshot`, `fork`, see `template`): a set-up sandbox is paused (its tmpfs volumes staged into its layer),
then kept as its stopped container's layer (`layers`: members see it through overlay volumes, each member's
writes in its own fork directory) or committed into an image (`DockerConfig.fork`); each member is a container
made as `create` makes one, its own tmpfs volumes filled from the stage once it runs. The template's container
or image goes with its release, or with its last member to close.

Every container is recorded in the state dir before it is made, every template image as it is committed
(`records`); what a server that died recorded is removed, containers with their host directories, then
images, by `reap_orphans()`, run before the first create. Labels name things for operators; they decide nothing.
"""

from __future__ import annotations

import asyncio
import os
import posixpath
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import docker
import docker.errors
import docker.types

from coding_agent_env.settings.backends import DockerConfig
from coding_agent_env.errors import (
    SandboxError,
    SandboxFileNotFoundError,
    SandboxUnavailableError,
    SandboxUnsupportedError,
)
from coding_agent_env.sandbox.base import (
    BackendStatus,
    Sandbox,
    SandboxBackend,
    SandboxLimits,
    SandboxSpec,
    SandboxTemplate,
    image_env,
    scopes,
)
from coding_agent_env.sandbox.docker.control import ControlChannel
from coding_agent_env.sandbox.docker.engine import SDK_ERRORS, call, translate
from coding_agent_env.sandbox.docker.engine_exec import EngineExec
from coding_agent_env.sandbox.docker.hostdir import HostDir
from coding_agent_env.sandbox.docker.layers import ForkDir, same_files_refusal, upper_fs_refusal
from coding_agent_env.sandbox.docker.layout import AGENTS_DIR, LAYOUT, RELAY_SOCKET, TESTS, SandboxLayout
from coding_agent_env.sandbox.docker.reaper import (
    LABEL_FORKDIR,
    LABEL_OWNER,
    LABEL_ROLLOUT,
    LABEL_TEMPLATE,
    owner,
    reap,
)
from coding_agent_env.sandbox.docker.records import Made, new_name
from coding_agent_env.sandbox.docker.sandbox import DockerSandbox
from coding_agent_env.sandbox.docker.seed import Seeder
from coding_agent_env.sandbox.docker.template import STAGE, DockerTemplate, LayerTemplate, fill, freeze
from coding_agent_env.sandbox.docker.transport import DockerTransport
from coding_agent_env.sandbox.launcher.client import SANDBOX_UID
from coding_agent_env.settings import Settings

__all__ = ["DockerBackend"]

_CAPS = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETUID", "SETGID"]
"""Only the root-run launcher uses these; commands run as uid 1000 and have none."""
_USERS_CAPS = ["AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
               "NET_RAW", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"]
"""With `SandboxSpec.users`: what Docker gives a default container, for commands run as root (`user="root"`),
which may switch to another user (`setpriv`, `su`). Any other uid has none (the kernel drops them at setuid;
`no-new-privileges` keeps a setuid binary or file capability from giving any back)."""
_SIZED_DRIVERS = {"btrfs", "zfs", "devicemapper"}
"""Storage drivers that take `storage_opt size` (overlay2 too, over xfs with project quotas: tried, see below)."""


class DockerBackend(SandboxBackend):
    """Makes `DockerSandbox`es on the daemon at `DockerConfig.host`."""

    name = "docker"

    def __init__(self, config: DockerConfig, settings: Settings) -> None:
        self._config = config
        self._settings = settings
        self._client: docker.DockerClient | None = None
        self._reaped = False
        self._sized: bool | None = None
        """Whether the engine bounds a container's writable layer (`storage_opt`); None: not known yet."""
        self._image_envs: dict[str, dict[str, str]] = {}
        self._image_ids: dict[str, str] = {}
        self._image_volumes: dict[str, tuple[str, ...]] = {}
        self._made = Made(settings.state_dir)
        """This server's record of what it makes on the engine: all the reaper removes (`records`)."""
        self._seeder = Seeder(self._made)
        self._layers_why: tuple[str | None] | None = None
        """Why templates cannot be kept as layers here (`_layers_refusal`), once asked."""

    def client(self) -> docker.DockerClient:
        if self._client is None:
            self._client = docker.DockerClient(base_url=self._config.daemon_url)
        return self._client

    def _limits(self, limits: SandboxLimits, sized: bool) -> tuple[dict[str, int], dict[str, int]]:
        """(what the container is asked to enforce, the rlimits the launcher sets on every command). Without a
        sized writable layer the workdir's tmpfs pages count against the container's memory: raised by them."""
        disk = limits.disk_mb << 20
        engine = {"memory": (limits.memory_mb << 20) + (0 if sized else disk), "pids": limits.max_processes,
                  "disk": disk}
        if limits.cpus > 0:
            engine["nano_cpus"] = round(limits.cpus * 1e9)
        return engine, limits.rlimits(nproc=False)

    def _is_sized(self) -> bool:
        """Whether the engine's storage driver can bound a container's writable layer (asked once)."""
        if self._sized is None:
            info = self.client().api.info()
            status = dict(info.get("DriverStatus") or [])
            driver = info.get("Driver", "")
            on_xfs = driver == "overlay2" and status.get("Backing Filesystem") == "xfs"
            self._sized = driver in _SIZED_DRIVERS or on_xfs
        return self._sized

    def check(self) -> BackendStatus:
        engine, launcher = self._limits(SandboxLimits.from_settings(self._settings), sized=False)
        limits = {**engine, **launcher}
        url = self._config.daemon_url
        socket_path = url.removeprefix("unix://")
        if url.startswith("unix://") and not os.path.exists(socket_path):
            return BackendStatus(self.name, False, None, f"no usable Docker daemon: no socket at {socket_path}", limits)
        image = self._config.image
        try:
            version = self.client().version()
            present = bool(self.client().images.list(name=image))
        except SDK_ERRORS as exc:
            err = translate(exc, "docker")
            return BackendStatus(self.name, False, None, f"no usable Docker daemon: {err}", limits)
        detail = f"Docker {version.get('Version', '?')}; default image {image!r} "
        detail += "present" if present else "absent (pulled at the first rollout)"
        try:
            sized = self._is_sized()
        except SDK_ERRORS:
            sized = False
        engine, launcher = self._limits(SandboxLimits.from_settings(self._settings), sized=sized)
        limits = {**engine, **launcher}
        detail += "; disk: the writable layer's size" if sized else "; disk: a tmpfs workdir (the rest unbounded)"
        return BackendStatus(self.name, True, "docker", detail, limits, self._scopes(limits, sized))

    @staticmethod
    def _scopes(limits: dict[str, int], sized: bool) -> dict[str, str]:
        return scopes(limits, **({} if sized else {"disk": "workdir"}))

    def _transport(self) -> DockerTransport:
        """The transport for a new sandbox: see `DockerConfig.transport`."""
        choice = self._config.transport
        if choice == "auto":
            local = self._config.daemon_url.startswith("unix://")
            choice = "control" if local and HostDir.fits(self._settings.state_dir) else "exec"
        return ControlChannel.prepare(self._settings.state_dir) if choice == "control" else EngineExec()

    async def build_image(self, context: str, tag: str) -> bool:
        """Build `context` (a directory with a Dockerfile) as `tag` with the engine's build API, unless an image
        of that tag exists (tags are content hashes: same tag, same build). True when it built one. Nothing is
        pulled that is not already present (`pull=False`); a failed build is a SandboxError with the engine's
        last lines."""
        if await call("look up image", self.client().images.list, name=tag):
            return False
        await call("build image", self._build, context, tag)
        return True

    def _build(self, context: str, tag: str) -> None:
        try:
            self.client().images.build(path=context, tag=tag, rm=True, pull=False, forcerm=True)
        except docker.errors.BuildError as exc:
            tail = " | ".join(str(item.get("stream") or item.get("error") or "").strip()
                              for item in list(exc.build_log)[-3:])
            raise SandboxError(f"building {tag} failed: {exc.msg}: {tail}"[:1000]) from exc

    async def create(self, spec: SandboxSpec) -> Sandbox:
        await self._admit(spec)
        layout = SandboxLayout.of(spec)
        image = spec.image or self._config.image
        seeded = _claimed(spec, layout)
        box = await self._make(spec, layout, image, seeded, None)
        seeds = () if self._sized else seeded
        return await box.opened(self._start(box, spec, seeds))

    async def _admit(self, spec: SandboxSpec) -> None:
        """Reap once per backend, before its first sandbox; refuse a network policy the server does not allow."""
        if not self._reaped:
            self._reaped = True
            await self.reap_orphans()
        if spec.network == "host" and not self._settings.sandbox_allow_host_network:
            raise SandboxUnavailableError("network policy 'host' is not allowed by this server's operator")
        if spec.network == "llm" and spec.relay is None:
            raise SandboxError("network policy 'llm' needs a relay endpoint")

    async def _make(self, spec: SandboxSpec, layout: SandboxLayout, image: str, no_copy: tuple[str, ...],
                    env: Mapping[str, str] | None, extra: _Extra | None = None) -> DockerSandbox:
        """A created (not started) container of `image` for `spec`, as its `DockerSandbox`; `no_copy`: the
        mounts the engine leaves empty (filled once started); `env`: the image's ENV, None to look it up;
        `extra`: a group member's further mounts and labels."""
        transport = self._transport()
        name = new_name()
        creating = asyncio.ensure_future(call("create container", self._create_container, spec, transport, layout,
                                              image, no_copy, extra or _Extra(), name))
        try:
            container_id = await asyncio.shield(creating)
        except BaseException:
            # Cancelled while the engine creates it: the container still appears, so remove it once it has.
            await asyncio.shield(self._discard(creating, name))
            await transport.close()
            raise
        try:
            if env is None:
                env = await self._image_env(image)
        except BaseException:
            await asyncio.shield(self._discard(creating, name))
            await transport.close()
            raise
        sized = bool(self._sized)
        engine, launcher = self._limits(self._spec_limits(spec), sized)
        box = DockerSandbox(container_id, transport, api=self.client().api, spec=spec, layout=layout, rlimits=launcher,
                            container_limits=engine, timeouts=self._config.timeouts, relay_port=self._config.relay_port,
                            scopes=self._scopes({**engine, **launcher}, sized),
                            engine_here=self._config.daemon_url.startswith("unix://"))
        box.task_env = MappingProxyType({**env, **spec.env})
        box.after_close(_forgetting(box, self._made, name))
        return box

    # -- groups: a set-up sandbox frozen into an image, members forked from it (see `template`) ----------------

    def fork_refusal(self, spec: SandboxSpec) -> str | None:
        """None, but for an image already known to declare a VOLUME (no commit holds one); a layout found
        uncapturable only at `snapshot` is refused there."""
        volumes = self._image_volumes.get(spec.image or self._config.image)
        if volumes:
            return f"the image declares VOLUME {sorted(volumes)[0]!r}, which a template image cannot hold"
        return None

    async def snapshot(self, sandbox: Sandbox) -> SandboxTemplate:
        """Freeze `sandbox` (a `DockerSandbox` of this backend) into a template (`template.freeze`: kept as its
        layer, or committed into an image, as `DockerConfig.fork` says); the sandbox is closed whatever happens,
        its container removed unless the template keeps it."""
        try:
            if not isinstance(sandbox, DockerSandbox) or sandbox.closed:
                raise SandboxError("only an open sandbox of the Docker backend can be frozen into a template")
            spec = sandbox.spec
            env = await self._image_env(spec.image or self._config.image)
            method = self._config.fork
            why_not = await self._layers_refusal() if method != "image" else None
            if why_not is not None:
                if method == "layers":
                    why_not = f"a template cannot be kept as its layer: {why_not}"
                    raise SandboxUnsupportedError(self.name, "group", why_not)
                method = "image"
            template = await freeze(self.client().api, sandbox.id, spec, sandbox.sandbox_layout, env, method=method,
                                    own=self._own_tops(sandbox.sandbox_layout),
                                    room=ForkDir.room(self._settings.state_dir), made=self._made)
            if isinstance(template, LayerTemplate):
                sandbox.keep_container()
            return template
        finally:
            await asyncio.shield(sandbox.close())

    async def _layers_refusal(self) -> str | None:
        """Why no template can be kept as its layer here, before looking at one (`layers`): a daemon that does
        not see this server's files at the same paths (on another host, or in another mount namespace: the peer
        of its socket is not a root process of this one's), a rootless or user-remapped daemon, a sized writable
        layer (a member's overlays would escape the bound), a state dir that cannot hold upper layers. A definite
        answer is kept; one the daemon could not give now (unreachable) is asked again next time."""
        if self._layers_why is not None:
            return self._layers_why[0]
        why, definite = await asyncio.to_thread(self._probe_layers)
        if definite:
            self._layers_why = (why,)
        return why

    def _probe_layers(self) -> tuple[str | None, bool]:
        url = self._config.daemon_url
        if not url.startswith("unix://"):
            return "the Docker daemon is not on this host", True
        if self._sized:
            return "the engine sizes writable layers, which a member's overlays would escape", True
        try:
            why = same_files_refusal(url.removeprefix("unix://"))
        except SandboxUnavailableError as exc:
            return str(exc), False
        if why is not None:
            return why, True
        try:
            options = " ".join(self.client().api.info().get("SecurityOptions") or [])
        except SDK_ERRORS as exc:
            return f"the daemon's security options are not known: {translate(exc, 'docker')}", False
        if "name=rootless" in options or "name=userns" in options:
            return "the daemon is rootless or remaps users", True
        return upper_fs_refusal(self._settings.state_dir), True

    def _own_tops(self, layout: SandboxLayout) -> frozenset[str]:
        """The top-level names a member mounts at itself or that are the sandbox's machinery (`layers.plan`)."""
        tests = (TESTS,) if layout.paths.tests is not None else ()  # a link the member's init makes
        paths = (LAYOUT.base, *tests, layout.paths.workdir, *layout.roots, *self._config.host_binds)
        return frozenset(p.strip("/") for p in paths if p.strip("/") and "/" not in p.strip("/"))

    async def fork(self, spec: SandboxSpec, template: SandboxTemplate) -> Sandbox:
        """A member of `template`'s group, made as `create(spec)` makes a sandbox (own container, network, relay,
        limits, launcher) but of the template's image (and over a kept layer, its overlays), its own tmpfs
        volumes filled from the template once started."""
        layout = SandboxLayout.of(spec)
        if not isinstance(template, DockerTemplate):
            raise SandboxUnsupportedError(self.name, "group", f"template {template.id} is not a Docker template")
        template.admit(spec, layout)
        await self._admit(spec)
        template.joined()
        forkdir: ForkDir | None = None
        try:
            extra = _Extra(labels={LABEL_TEMPLATE: template.id})
            if isinstance(template, LayerTemplate):
                forkdir = ForkDir.make(self._settings.state_dir)
                extra.mounts.extend(forkdir.mounts(template.overlays))
                extra.binds.update({template.stage: STAGE} if template.stage is not None else {})
                extra.labels[LABEL_FORKDIR] = str(forkdir.path)
            box = await self._make(spec, layout, template.image, template.captured, template.env, extra)
        except BaseException:
            if forkdir is not None:
                forkdir.remove()
            await asyncio.shield(template.left())
            raise
        box.after_close(_leaving(box, template, forkdir))
        return await box.opened(self._start_member(box, template))

    async def _start_member(self, box: DockerSandbox, template: DockerTemplate) -> None:
        await box.start()
        labels = {LABEL_ROLLOUT: box.spec.rollout_id, LABEL_OWNER: owner()}
        await fill(self.client().api, box, template, labels)

    async def _start(self, box: DockerSandbox, spec: SandboxSpec, seeds: tuple[str, ...]) -> None:
        """Start the container; then copy what the image holds at `seeds` (the mounts over the image's own
        directories, see `seed`) onto them, and give them back to the sandbox user."""
        await box.start()
        if seeds:
            image_id = self._image_ids[spec.image or self._config.image]
            labels = {LABEL_ROLLOUT: spec.rollout_id, LABEL_OWNER: owner()}
            copied = await self._seeder.seed(self.client().api, image_id, box.id, seeds, labels)
            if copied:
                await box.own_dirs(copied)

    async def _image_env(self, image: str) -> dict[str, str]:
        """The image's ENV (its `Config.Env`), looked up once per image name for the backend's lifetime (a
        Harbor task's image is named by its content hash; a tag rebuilt under a running server keeps the ENV it
        had when first used). Its id and declared VOLUMEs are kept with it."""
        if image not in self._image_envs:
            inspected = await call("inspect image", self.client().api.inspect_image, image)
            config = inspected.get("Config") or {}
            self._image_ids[image] = str(inspected.get("Id") or image)
            self._image_volumes[image] = tuple(config.get("Volumes") or ())
            self._image_envs[image] = image_env(config.get("Env"))
        return self._image_envs[image]

    async def _discard(self, creating: asyncio.Future[str], name: str) -> None:
        """Remove the container `creating` makes (once it has) and forget its record; a create that failed may
        have made it all the same, so it is looked for by its name. The record stays only where the container
        may still exist (its removal failed): the reaper's then."""
        try:
            container_id = await creating
        except BaseException:
            container_id = name  # the engine knows a container by its name as well as by its id
        try:
            await call("remove container", self.client().api.remove_container, container_id, force=True, v=True)
        except SandboxFileNotFoundError:
            pass  # never made, or gone: nothing to reap
        except SandboxError:
            return
        await asyncio.to_thread(self._made.forget, "c", name)

    def _spec_limits(self, spec: SandboxSpec) -> SandboxLimits:
        return spec.limits or SandboxLimits.from_settings(self._settings)

    def _create_container(self, spec: SandboxSpec, transport: DockerTransport, layout: SandboxLayout, image: str,
                          no_copy: tuple[str, ...], extra: _Extra, name: str) -> str:
        """Blocking: create the container, named `name` (recorded first, for the reaper: `records`); its id."""
        c = self._config
        sized = self._is_sized()
        engine, _ = self._limits(self._spec_limits(spec), sized)
        made = transport.container_spec(c.relay_port if spec.network == "llm" else None, layout)
        volumes = {path: {"bind": path, "mode": "ro"} for path in c.host_binds}
        if spec.network == "llm":
            assert spec.relay is not None
            volumes[spec.relay.socket_path] = {"bind": RELAY_SOCKET, "mode": "rw"}
        if spec.agents_dir is not None:
            volumes[spec.agents_dir] = {"bind": AGENTS_DIR, "mode": "ro"}
        volumes.update({source: {"bind": target, "mode": "ro"} for source, target in extra.binds.items()})
        kwargs: dict[str, Any] = dict(
            name=name,
            image=image,
            command=made.command,
            labels={LABEL_ROLLOUT: spec.rollout_id, LABEL_OWNER: owner(), **made.labels, **extra.labels},
            network_mode="host" if spec.network == "host" else "none",
            volumes={**volumes, **made.volumes},
            mem_limit=engine["memory"],
            memswap_limit=engine["memory"],
            pids_limit=engine["pids"],
            nano_cpus=engine.get("nano_cpus", 0),
            cap_drop=["ALL"],
            cap_add=_USERS_CAPS if spec.users else _CAPS,
            security_opt=["no-new-privileges"],
            user="0:0",
            working_dir="/",
            environment={},
        )
        if sized:
            kwargs["storage_opt"] = {"size": f"{engine['disk']}"}
        else:
            # An anonymous volume of the local driver, of type tmpfs: removed with the container (`v=True`), and
            # unlike a `tmpfs` mount reached by the engine's archive API, which the file operations use. One at
            # the workdir and one at each of the task's further roots (see the module docstring). What the
            # image holds there the engine would copy into the tmpfs at create and lose at once (it is unmounted
            # until start): `no_copy`, and it is copied onto it once started (`seed`). So the disk budget stays
            # the bound and the image's files stay visible (a plain volume would show them, bounded by nothing).
            options = f"size={engine['disk']},mode=0755,uid={SANDBOX_UID},gid={SANDBOX_UID}"
            driver = docker.types.DriverConfig("local", {"type": "tmpfs", "device": "tmpfs", "o": options})
            kwargs["mounts"] = [docker.types.Mount(path, None, type="volume", driver_config=driver,
                                                   **({"no_copy": True} if path in no_copy else {}))
                                for path in (layout.paths.workdir, *layout.roots)]
        if extra.mounts:
            kwargs["mounts"] = [*kwargs.get("mounts", []), *extra.mounts]
        twice = _duplicate_target(kwargs)
        if twice is not None:  # before the engine makes anything (a volume per mount, which it would not remove)
            raise SandboxError(f"two mounts at {twice}: refused before anything was made")
        try:
            self._made.add("c", name)
        except OSError as exc:  # what is not recorded would never be reaped: not made
            raise SandboxError(f"cannot record the container for the reaper: {exc.strerror}") from exc
        # The low-level API: `containers.create` would inspect the new container (one more round trip).
        api = self.client().api
        try:
            return _create(api, kwargs)
        except docker.errors.ImageNotFound:
            self.client().images.pull(image)
            return _create(api, kwargs)
        except docker.errors.APIError as exc:
            if not sized or "storage" not in str(exc).lower():
                raise
            # overlay2 over xfs without project quotas: the workdir's tmpfs instead, from now on.
            self._sized = False
            return self._create_container(spec, transport, layout, image, no_copy, extra, name)

    async def reap_orphans(self) -> int:
        """Remove what dead servers on this host recorded making under the state dir (`records`: their
        containers, with their host and fork dirs, and their template images), never what a label alone claims."""
        return await call("reap containers", reap, self.client().api, self._settings.state_dir)

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await asyncio.to_thread(client.close)


@dataclass(frozen=True)
class _Extra:
    """A group member's further mounts (overlay volumes), read-only binds (host path: target) and labels."""

    mounts: list[docker.types.Mount] = field(default_factory=list)
    binds: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)


def _leaving(box: DockerSandbox, template: DockerTemplate, forkdir: ForkDir | None) -> Callable[[], Awaitable[None]]:
    """What a member's close does once its container is gone: its fork directory removed (not while the
    container may still run: then it is the reaper's), and the template told, whatever happens."""
    async def leave() -> None:
        try:
            if forkdir is not None and box.removed:
                await asyncio.to_thread(forkdir.remove)
        finally:
            await template.left()

    return leave


def _forgetting(box: DockerSandbox, made: Made, name: str) -> Callable[[], Awaitable[None]]:
    """What a sandbox's close does once its container (named `name`) is removed: its record dropped (a container
    kept as a template's layer stays recorded: the template forgets it as it removes it)."""
    async def forget() -> None:
        if box.removed:
            await asyncio.to_thread(made.forget, "c", name)

    return forget


def _duplicate_target(kwargs: Mapping[str, Any]) -> str | None:
    """A path two of a container's mounts (`mounts`, and the binds of `volumes`) would be made at, shown
    printable and bounded; None when every target is its own."""
    targets = [str(mount.get("Target") or "") for mount in kwargs.get("mounts") or []]
    targets += [str(bind.get("bind") or "") for bind in (kwargs.get("volumes") or {}).values()]
    seen: set[str] = set()
    for target in targets:
        normal = posixpath.normpath(target)
        if normal in seen:
            return ascii(normal)[:200]
        seen.add(normal)
    return None


def _claimed(spec: SandboxSpec, layout: SandboxLayout) -> tuple[str, ...]:
    """The mounts over directories the image may hold: the spec's workdir (`/workspace`, the backend's own, is
    never an image's) and the task's further roots."""
    return (*([layout.paths.workdir] if spec.workdir is not None else []), *layout.roots)


def _create(api: Any, kwargs: dict[str, Any]) -> str:
    """Create a container with the SDK's own argument mapping; returns its id. The SDK also declares each bind's
    target a volume of the container's config (`Config.Volumes`): the binds need no such entry, and a commit
    would make them VOLUMEs of a template's image (fresh anonymous volumes over its members' paths)."""
    from docker.models.containers import _create_container_args

    args = _create_container_args(dict(kwargs, version=api._version))
    args.pop("volumes", None)
    return str(api.create_container(**args)["Id"])
