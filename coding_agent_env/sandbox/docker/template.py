"""A set-up Docker sandbox frozen into a template (`DockerTemplate`), and what a member forked from it needs.

`freeze` (for `DockerBackend.snapshot`): the container is paused (its processes stop where they are and never run
again), the mounts its layer does not hold (the workdir and the task's further roots where they are tmpfs
volumes, see `backend`) are copied through the archive API into the container's own layer under `STAGE` (by
way of a host temporary file: the engine locks a container's archive while it is read, so a copy streamed
from a container into itself would wait for itself). Its home, /tmp, logs and `/tests` link are in its layer.
Its binds (the host's read-only directories, the launcher's code, the relay socket, the agents) are not the
sandbox's state: each member gets its own. Then one of two ways (`DockerConfig.fork`):

- `layers` (`LayerTemplate`, see `layers`): where the engine is on this host, its driver overlay2 and the server
  root, the container is stopped and kept: its layer over its image's is the set-up state, which members see
  through overlay volumes, nothing copied (milliseconds, whatever setup wrote).
- `image` (`ImageTemplate`): the container is committed into an image labelled with this server (`LABEL_OWNER`,
  so the reaper finds it after a crash) and the template (`LABEL_TEMPLATE`); members are its containers. A
  commit copies what setup wrote (seconds for a few hundred MB); it works on any engine.

`fill` (for `DockerBackend.fork`): a member's tmpfs volumes (its own disk budget) are empty at start; once it
runs they are filled from `STAGE`: by `cp -a` inside it, or, for an image without `cp`, streamed through the
archive API (from a never-started container of a template's image, `seed.copy_from_image`, or from a kept
layer's directory on this host). The copy is bounded by the member's disk budget, as the setup's writes were by
the template's.

A layout it cannot capture is refused (`uncapturable`): a volume the image declares (`VOLUME`: the engine gives
each container a fresh one, which neither a commit nor the layer holds) or any other mount they would miss.

`DockerTemplate` counts its open members: `release` gives back its image or container at once when none is open,
else the last one to close does (the engine will not remove an image a container uses, and it is never forced;
a kept layer is the lower layer of its members' overlays).
"""

from __future__ import annotations

import abc
import asyncio
import logging
import posixpath
import secrets
import tarfile
import tempfile
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import docker.errors

from coding_agent_env.errors import SandboxError, SandboxFileNotFoundError, SandboxUnsupportedError
from coding_agent_env.sandbox.base import SandboxSpec, SandboxTemplate
from coding_agent_env.sandbox.docker import tar
from coding_agent_env.sandbox.docker.engine import call
from coding_agent_env.sandbox.docker.layers import Overlay, layers_refusal, plan
from coding_agent_env.sandbox.docker.layout import LAYOUT, SandboxLayout
from coding_agent_env.sandbox.docker.records import Made
from coding_agent_env.sandbox.docker.reaper import LABEL_HOSTDIR, LABEL_OWNER, LABEL_ROLLOUT, LABEL_TEMPLATE, owner
from coding_agent_env.sandbox.docker.seed import copy_from_image

if TYPE_CHECKING:
    from coding_agent_env.sandbox.docker.sandbox import DockerSandbox

__all__ = ["STAGE", "DockerTemplate", "ImageTemplate", "LayerTemplate", "fill", "freeze", "uncapturable"]

log = logging.getLogger(__name__)

STAGE = f"{LAYOUT.base}/template"
"""Where a template's image keeps its captured mounts: `{STAGE}/{i}/{basename}` for the i-th (root's only)."""
_CHUNK = 256 * 1024
_STOP_S = 30
"""How long a killed template container may take to be reported stopped."""
_NOT_RUN = {126, 127}
"""Exit codes of a command that never ran (not found, not executable): the image has no `cp`."""


class DockerTemplate(SandboxTemplate):
    """A set-up sandbox of `spec` laid out as `layout`, frozen: members are containers of `image`; `captured`:
    the mount points filled from `STAGE` in each member (in order); `env`: the ENV of the image the sandbox was
    made of; `method`: how it was frozen. It counts its open members: `release` gives back what it holds at once
    when none is open, else the last one to close does."""

    backend = "docker"
    method: str

    def __init__(self, api: Any, *, image: str, spec: SandboxSpec, layout: SandboxLayout,
                 captured: tuple[str, ...], env: Mapping[str, str], template_id: str, made: Made, size: int) -> None:
        self.id = template_id
        self.made = made
        """Where what it holds is recorded for the reaper (`records`): forgotten as it is removed."""
        self.size = size
        self.image = image
        self.spec = spec
        self.layout = layout
        self.captured = captured
        self.env = MappingProxyType(dict(env))
        self._api = api
        self._open = 0
        """Members made or being made from it and not closed yet; once released, the last takes what it holds."""

    def admit(self, spec: SandboxSpec, layout: SandboxLayout) -> None:
        """Check a member's `spec` may be forked from this template (`SandboxUnsupportedError` naming `group`
        if not): not released, and the same image, layout and users as the template's own spec."""
        if self.released:
            raise SandboxUnsupportedError("docker", "group", f"template {self.id} was released: fork no more from it")
        mine = self.spec
        if (spec.image, layout, spec.users) != (mine.image, self.layout, mine.users):
            raise SandboxUnsupportedError("docker", "group", f"template {self.id} was made for another image, "
                                          "workdir, further roots, tests or users than this member asks")

    def joined(self) -> None:
        """A member is being made: what the template holds must stay."""
        self._open += 1

    async def left(self) -> None:
        """A member closed (or was never made): the last one after `release` gives back what the template
        holds. Never raises: what it cannot remove now is the reaper's at the next start."""
        self._open -= 1
        if self.released and self._open == 0:
            try:
                await asyncio.shield(self._remove())
            except SandboxError as exc:
                log.warning("template %s: left to the reaper: %s", self.id, exc)

    async def _release(self) -> None:
        if self._open == 0:
            await asyncio.shield(self._remove())

    @abc.abstractmethod
    async def _remove(self) -> None:
        """Give back what the template holds (its image, its container); gone already is fine."""


class ImageTemplate(DockerTemplate):
    """A template committed into an image (`image`, labelled with `LABEL_TEMPLATE`): members are its containers,
    their tmpfs volumes filled from `STAGE` in its layers."""

    method = "image"

    async def _remove(self) -> None:
        try:
            await call("remove template image", self._api.remove_image, self.image, force=False, noprune=False)
        except SandboxFileNotFoundError:
            pass
        await asyncio.to_thread(self.made.forget, "i", self.image)


class LayerTemplate(DockerTemplate):
    """A template kept as its stopped container `container_id`'s own layer (`layers`): members are containers
    of the sandbox's own image `image` with `overlays` mounted over it, and `STAGE` bound read-only from
    `stage` (a host path) when anything was `captured`."""

    method = "layers"

    def __init__(self, api: Any, *, container_id: str, recorded_as: str, overlays: tuple[Overlay, ...],
                 stage: str | None, **kwargs: Any) -> None:
        super().__init__(api, **kwargs)
        self.container_id = container_id
        self.recorded_as = recorded_as
        """The container's name, which the reaper's record holds (`records`)."""
        self.overlays = overlays
        self.stage = stage

    async def _remove(self) -> None:
        try:
            await call("remove template container", self._api.remove_container, self.container_id, force=True,
                       v=True)
        except SandboxFileNotFoundError:
            pass
        await asyncio.to_thread(self.made.forget, "c", self.recorded_as)


def uncapturable(mounts: list[dict[str, Any]], layout: SandboxLayout) -> str | None:
    """Why a container with `mounts` (its inspected `Mounts`) cannot be frozen, or None: any volume or tmpfs
    mount but the sandbox's own tmpfs volumes (its workdir and further roots)."""
    ours = {layout.paths.workdir, *layout.roots}
    for mount in mounts:
        kind, where = mount.get("Type"), str(mount.get("Destination") or "")
        if kind == "tmpfs" or (kind == "volume" and where not in ours):
            return f"{where!r} is a {kind} (a VOLUME of the image?), which an image of the sandbox cannot hold"
    return None


def captured_mounts(mounts: list[dict[str, Any]], layout: SandboxLayout) -> tuple[str, ...]:
    """The sandbox's own volumes among `mounts`, in layout order (none where its directories are in its
    writable layer)."""
    volumes = {str(m.get("Destination")) for m in mounts if m.get("Type") == "volume"}
    return tuple(path for path in (layout.paths.workdir, *layout.roots) if path in volumes)


async def freeze(api: Any, container_id: str, spec: SandboxSpec, layout: SandboxLayout, env: Mapping[str, str],
                 *, method: str, own: frozenset[str], room: int, made: Made) -> DockerTemplate:
    """Freeze the sandbox's container (see the module docstring): paused, its captured mounts staged in its
    layer, then kept as its own layer (a `LayerTemplate`, which owns the stopped container from then on) where
    `method` (`DockerConfig.fork`: `image`, `layers` or `auto`) allows and `layers.plan` can show it (`own`, `room`:
    see there), else committed (an `ImageTemplate`; the container stays the caller's to remove). Members of a kept
    layer are containers of the very image the container was made of (its id, whatever its tag names now).
    `SandboxUnsupportedError` naming `group` for a layout it cannot capture, or when `method` is `layers` and the
    layer cannot be kept. A committed image is recorded in `made` (the reaper's) as it is made; the template's
    `size` is its writable layer's (the container's, or the image's own layer)."""
    inspected = await call("inspect container", api.inspect_container, container_id)
    mounts = list(inspected.get("Mounts") or [])
    why = uncapturable(mounts, layout)
    if why is not None:
        raise SandboxUnsupportedError("docker", "group", why)
    captured = captured_mounts(mounts, layout)
    template_id = secrets.token_hex(8)
    # Image labels go to every container made of it: ours replace the container's (its rollout, its host dir).
    labels = {LABEL_OWNER: owner(), LABEL_TEMPLATE: template_id, LABEL_ROLLOUT: "", LABEL_HOSTDIR: ""}
    graph = inspected.get("GraphDriver") or {}
    freezing = asyncio.ensure_future(call("capture the sandbox", _freeze, api, container_id, captured, labels,
                                          method, graph, own, room, made))
    try:
        kept, size = await asyncio.shield(freezing)
    except asyncio.CancelledError:
        # The engine commits all the same: an image nobody would release. Removed once it exists.
        await asyncio.shield(_drop(api, freezing, made))
        raise
    common: dict[str, Any] = dict(spec=spec, layout=layout, captured=captured, env=env, template_id=template_id,
                                  made=made, size=size)
    if isinstance(kept, str):
        return ImageTemplate(api, image=kept, **common)
    overlays, stage = kept
    return LayerTemplate(api, container_id=container_id, recorded_as=str(inspected.get("Name") or "").lstrip("/"),
                         overlays=overlays, stage=stage,
                         image=str(inspected["Image"]), **common)


_Kept = tuple[tuple[Overlay, ...], str | None]
"""A layer kept: its overlays, and the host path of its stage (None when nothing was captured)."""


def _layer_size(api: Any, container_id: str) -> int:
    """Blocking: bytes of the container's writable layer (`SizeRw`: what setup wrote and what was staged, which a
    committed image's own layer holds too); 0 when the engine does not say."""
    try:
        found = api.containers(all=True, filters={"id": container_id}, size=True)
    except docker.errors.APIError:
        return 0
    return int(found[0].get("SizeRw") or 0) if found else 0


async def _drop(api: Any, freezing: asyncio.Future[tuple[str | _Kept, int]], made: Made) -> None:
    """Remove the image `freezing` commits, once committed (a kept layer goes with the container)."""
    try:
        kept, _ = await freezing
    except SandboxError:
        return  # never made
    if not isinstance(kept, str):
        return
    try:
        await call("remove template image", api.remove_image, kept, force=False, noprune=False)
    except SandboxError as exc:
        log.warning("image %s of a cancelled snapshot left to the reaper: %s", kept[:19], exc)
        return
    await asyncio.to_thread(made.forget, "i", kept)


def _freeze(api: Any, container_id: str, captured: tuple[str, ...], labels: dict[str, str], method: str,
            graph: Mapping[str, Any], own: frozenset[str], room: int, made: Made) -> tuple[str | _Kept, int]:
    """Blocking: pause, stage the captured mounts in the layer, measure it; then (overlays, the stage's host
    path) of the layer kept (the container stopped), or the id of the image it was committed into (recorded in
    `made`), with the layer's bytes."""
    api.pause(container_id)
    _stage(api, container_id, captured)
    size = _layer_size(api, container_id)
    data = graph.get("Data") or {}
    upper, lower = data.get("UpperDir"), data.get("LowerDir")
    refusal = "the server is set to commit templates (DOCKER_FORK=image)" if method == "image" else (
        layers_refusal(graph.get("Name"), upper, lower))
    if refusal is None:
        assert isinstance(upper, str) and isinstance(lower, str)
        # Stopped, its processes gone for good: the layer is a plain directory from now on, no mount's upper.
        api.kill(container_id)
        api.wait(container_id, timeout=_STOP_S)
        planned = plan(upper, lower, own, room)
        if not isinstance(planned, str):
            return (planned, (upper + STAGE if captured else None)), size
        refusal = planned
    if method == "layers":
        raise SandboxUnsupportedError("docker", "group", f"the template cannot be kept as its layer: {refusal}")
    if method == "auto" and graph.get("Name") == "overlay2":
        log.info("template: committed into an image: %s", refusal)
    # Paused (or stopped): the engine would pause it again around the commit.
    image = str(api.commit(container_id, conf={"Labels": labels}, pause=False)["Id"])
    try:
        made.add("i", image)
    except OSError as exc:  # an image not recorded would never be reaped: it is not kept
        api.remove_image(image, force=False, noprune=False)
        raise SandboxError(f"cannot record the template image for the reaper: {exc.strerror}") from exc
    return image, size


def _stage(api: Any, container_id: str, captured: tuple[str, ...]) -> None:
    """Blocking: copy each captured mount (a tmpfs volume, which neither a commit nor the layer holds) into
    the container's layer under `STAGE`."""
    if not captured:
        return
    base = LAYOUT.base.lstrip("/")
    stage = STAGE.lstrip("/")
    dirs = {base: (0, 0o755), stage: (0, 0o700), **{f"{stage}/{i}": (0, 0o700) for i in range(len(captured))}}
    api.put_archive(container_id, "/", tar.tree_tar(dirs, {}))
    for i, path in enumerate(captured):
        with tempfile.TemporaryFile() as spool:
            stream, _ = api.get_archive(container_id, path, chunk_size=_CHUNK)
            try:
                for chunk in stream:
                    spool.write(chunk)
            finally:
                getattr(stream, "close", lambda: None)()
            spool.seek(0)
            # In chunks: given the file itself, the HTTP client would send it 8 KiB at a time.
            api.put_archive(container_id, f"{STAGE}/{i}", iter(lambda: spool.read(_CHUNK), b""))


async def fill(api: Any, box: DockerSandbox, template: DockerTemplate, labels: Mapping[str, str]) -> None:
    """Copy each captured mount of `template` from `STAGE` (in its image, or bound from its kept layer) onto the
    running member `box`'s own mount there: within the container (`cp -a` as root: owners, modes, times, links
    kept; the fastest way, no byte leaves the container), or where the image has no `cp`, through the archive
    API (from a helper container carrying `labels`, the member's, for the reaper; or from the kept layer's
    directory on this host). `SandboxError` when a copy fails (more than the member's disk budget, say)."""
    streamed: list[tuple[str, str]] = []
    for i, path in enumerate(template.captured):
        source = f"{STAGE}/{i}/{posixpath.basename(path)}"
        # `SOURCE/.` onto the mount point: its content, and the directory's own owner, mode and times.
        code, _, err = await box.run_machinery(["cp", "-a", "--", f"{source}/.", path], privileged=True)
        if code in _NOT_RUN:
            streamed.append((source, posixpath.dirname(path)))
        elif code != 0:
            detail = err.decode(errors="replace").strip()[-300:]
            raise SandboxError(f"cannot fill {path} from template {template.id}: {detail}")
    if not streamed:
        return
    if isinstance(template, LayerTemplate):
        assert template.stage is not None
        for source, directory in streamed:
            host = template.stage + source.removeprefix(STAGE)
            await call("fill the sandbox from its template", _put_host_tree, api, box.id, host, directory)
    else:
        await copy_from_image(api, template.image, box.id, streamed, labels, template.made)


def _put_host_tree(api: Any, container_id: str, host: str, directory: str) -> None:
    """Blocking: the host directory `host` (itself and its content, never following a link) into `directory` of
    the container, by way of a host temporary file. `SandboxError` when the directory cannot be read."""
    with tempfile.TemporaryFile() as spool:
        try:
            with tarfile.open(fileobj=spool, mode="w", format=tarfile.PAX_FORMAT) as archive:
                archive.add(host, arcname=posixpath.basename(host), recursive=True)
        except (OSError, tarfile.TarError) as exc:
            why = getattr(exc, "strerror", None) or type(exc).__name__  # not the host path
            raise SandboxError(f"cannot read the template's staged {posixpath.basename(host)}: {why}") from exc
        spool.seek(0)
        api.put_archive(container_id, directory, iter(lambda: spool.read(_CHUNK), b""))
