"""A set-up Docker sandbox frozen into an image (`DockerTemplate`), and what a member forked from it needs.

`freeze` (for `DockerBackend.snapshot`): the container is paused (its processes stop where they are and never run
again), the mounts a commit does not hold (the workdir and the task's further roots where they are tmpfs
volumes, see `backend`) are copied through the archive API into the container's own layer under `STAGE` (by
way of a host temporary file: the engine locks a container's archive while it is read, so a copy streamed
from a container into itself would wait for itself), and
the container is committed into an image labelled with this server (`LABEL_OWNER`, so the reaper finds it
after a crash) and the template (`LABEL_TEMPLATE`). Its home, /tmp, logs and `/tests` link are in its layer:
the commit holds them. Its binds (the host's read-only directories, the launcher's code, the relay socket,
the agents) are not the sandbox's state: each member gets its own.

`fill` (for `DockerBackend.fork`): a member's container of that image has its own tmpfs volumes (its own disk
budget), empty at start; once it runs they are filled from `STAGE`, in its image layers: by `cp -a` inside it,
or, for an image without `cp`, streamed from a never-started container of the image (`seed.copy_from_image`).
The copy is bounded by the member's disk budget, as the setup's writes were by the template's.

A layout it cannot capture is refused (`uncapturable`): a volume the image declares (`VOLUME`: the engine gives
each container a fresh one, which no commit holds) or any other mount a commit would miss.

`DockerTemplate` counts its open members: `release` removes the image at once when none is open, else the last
one to close does (the engine will not remove an image a container uses, and it is never forced).
"""

from __future__ import annotations

import asyncio
import logging
import posixpath
import secrets
import tempfile
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from coding_agent_env.errors import SandboxError, SandboxFileNotFoundError, SandboxUnsupportedError
from coding_agent_env.sandbox.base import SandboxSpec, SandboxTemplate
from coding_agent_env.sandbox.docker import tar
from coding_agent_env.sandbox.docker.engine import call
from coding_agent_env.sandbox.docker.layout import LAYOUT, SandboxLayout
from coding_agent_env.sandbox.docker.reaper import LABEL_HOSTDIR, LABEL_OWNER, LABEL_ROLLOUT, LABEL_TEMPLATE, owner
from coding_agent_env.sandbox.docker.seed import copy_from_image

if TYPE_CHECKING:
    from coding_agent_env.sandbox.docker.sandbox import DockerSandbox

__all__ = ["STAGE", "DockerTemplate", "fill", "freeze", "uncapturable"]

log = logging.getLogger(__name__)

STAGE = f"{LAYOUT.base}/template"
"""Where a template's image keeps its captured mounts: `{STAGE}/{i}/{basename}` for the i-th (root's only)."""
_CHUNK = 256 * 1024
_NOT_RUN = {126, 127}
"""Exit codes of a command that never ran (not found, not executable): the image has no `cp`."""


class DockerTemplate(SandboxTemplate):
    """Image `image_id` of a set-up sandbox of `spec` laid out as `layout`; `captured`: the mount points filled
    from `STAGE` in each member (in order); `env`: the ENV of the image the sandbox was made of."""

    backend = "docker"

    def __init__(self, api: Any, *, image_id: str, spec: SandboxSpec, layout: SandboxLayout,
                 captured: tuple[str, ...], env: Mapping[str, str], template_id: str) -> None:
        self.id = template_id
        self.image_id = image_id
        self.spec = spec
        self.layout = layout
        self.captured = captured
        self.env = MappingProxyType(dict(env))
        self._api = api
        self._open = 0
        """Members made or being made from it and not closed yet; once released, the image goes with the last."""

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
        """A member is being made: the image must stay."""
        self._open += 1

    async def left(self) -> None:
        """A member closed (or was never made): the last one after `release` removes the image. Never raises:
        an image it cannot remove now is the reaper's at the next start."""
        self._open -= 1
        if self.released and self._open == 0:
            try:
                await self._remove()
            except SandboxError as exc:
                log.warning("template %s: image %s left to the reaper: %s", self.id, self.image_id[:19], exc)

    async def _release(self) -> None:
        if self._open == 0:
            await self._remove()

    async def _remove(self) -> None:
        """Remove the image, shielded (a cancelled caller does not leave it half done)."""
        try:
            await asyncio.shield(call("remove template image", self._api.remove_image, self.image_id,
                                      force=False, noprune=False))
        except SandboxFileNotFoundError:
            pass  # already gone


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


async def freeze(api: Any, container_id: str, spec: SandboxSpec, layout: SandboxLayout,
                 env: Mapping[str, str]) -> DockerTemplate:
    """Pause the container, capture it into a template image (see the module docstring); the container is the
    caller's to remove. `SandboxUnsupportedError` naming `group` for a layout it cannot capture."""
    inspected = await call("inspect container", api.inspect_container, container_id)
    mounts = list(inspected.get("Mounts") or [])
    why = uncapturable(mounts, layout)
    if why is not None:
        raise SandboxUnsupportedError("docker", "group", why)
    captured = captured_mounts(mounts, layout)
    template_id = secrets.token_hex(8)
    # Image labels go to every container made of it: ours replace the container's (its rollout, its host dir).
    labels = {LABEL_OWNER: owner(), LABEL_TEMPLATE: template_id, LABEL_ROLLOUT: "", LABEL_HOSTDIR: ""}
    committing = asyncio.ensure_future(call("capture the sandbox", _commit, api, container_id, captured, labels))
    try:
        image_id = await asyncio.shield(committing)
    except asyncio.CancelledError:
        # The engine commits all the same: an image nobody would release. Removed once it exists.
        await asyncio.shield(_drop(api, committing))
        raise
    return DockerTemplate(api, image_id=image_id, spec=spec, layout=layout, captured=captured, env=env,
                          template_id=template_id)


async def _drop(api: Any, committing: asyncio.Future[str]) -> None:
    """Remove the image `committing` makes, once made."""
    try:
        image_id = await committing
    except SandboxError:
        return  # never made
    try:
        await call("remove template image", api.remove_image, image_id, force=False, noprune=False)
    except SandboxError as exc:
        log.warning("image %s of a cancelled snapshot left to the reaper: %s", image_id[:19], exc)


def _commit(api: Any, container_id: str, captured: tuple[str, ...], labels: dict[str, str]) -> str:
    """Blocking: pause, stage the captured mounts in the layer, commit; the new image's id."""
    api.pause(container_id)
    if captured:
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
    # Already paused: the engine would pause it again around the commit.
    return str(api.commit(container_id, conf={"Labels": labels}, pause=False)["Id"])


async def fill(api: Any, box: DockerSandbox, template: DockerTemplate, labels: Mapping[str, str]) -> None:
    """Copy each captured mount of `template` from its image's `STAGE` onto the running member `box`'s own mount
    there: within the container (`cp -a` as root: owners, modes, times, links kept; the fastest way, no byte
    leaves the container), or where the image has no `cp`, through the archive API from a helper container
    carrying `labels` (the member's, for the reaper). `SandboxError` when a copy fails (more than the member's
    disk budget, say)."""
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
    if streamed:
        await copy_from_image(api, template.image_id, box.id, streamed, labels)
