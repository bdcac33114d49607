"""A group's template kept as its stopped container's own layer, and the overlay volumes members see it through.

Committing a set-up sandbox into an image copies every byte setup wrote (a tar of the container's layer, hashed,
unpacked into a new one: seconds for a few hundred MB). Where the engine runs on this host with the `overlay2`
storage driver and the server may read its layer directories (it runs as root), nothing needs copying: the
stopped container's writable layer (`UpperDir`) over its image's layers (`LowerDir`) *is* the set-up file
system. A member is then a container of the same image, and each top-level directory setup wrote in (`/home`,
`/etc`, `/opt`, ...) is mounted over it as a volume of the engine's `local` driver of type `overlay`: the
template's directory and the image's below it as read-only lower layers, an upper directory of the member's own
(under its fork directory, `ForkDir`) taking its writes. Deletions and replaced directories (whiteouts, opaque
directories in the template's layer) mean in a member what they meant in the template: the kernel reads the
layers the same way. The kernel never writes a lower layer: no member sees another's writes, and none changes
the template.

`plan` says what mounts a member needs, or why this template cannot be shown so (then it is committed, see
`template`): a top-level entry setup made that is not a directory (a file, a link, a whole top-level directory
deleted), or a path the mount options cannot carry. The top-level directories the member mounts something at
itself (its workdir, its further roots, the operator's binds) and the sandbox's machinery are not mounted over:
they are the member's own, as in any sandbox.

A member's writes through these volumes land in its fork directory on the host disk, bounded as its container
layer is (the disk budget bounds the workdir and the further roots only, see `backend`); the directory goes with
the member (and with the reapers, named `<pid>-docker-<hex>` under the state dir like a host directory).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

import docker.types

from coding_agent_env.errors import SandboxError
from coding_agent_env.sandbox.launcher.inside.treeops import remove_tree

__all__ = ["ForkDir", "Overlay", "layers_refusal", "plan", "upper_fs_refusal"]

_KERNEL = frozenset({"proc", "sys", "dev"})
"""Top-level directories the engine mounts the kernel's file systems at: nothing setup wrote is there."""
_OPAQUE = "trusted.overlay.opaque"
_OPTIONS_MAX = 3800
"""The kernel takes a mount's options in one page (4096 bytes): room for `upperdir` and `workdir` is kept."""
_OVERLAYS_MAX = 64
"""More top-level directories than this (a setup that made hundreds) are committed: one mount each per member."""
_NO_UPPER = frozenset({"overlay", "aufs", "nfs", "nfs4", "cifs", "smb3", "9p", "fuse", "ecryptfs"})
"""File systems an overlay's upper layer cannot be on (or not reliably)."""
_UNSAFE = frozenset(",:=\\")
"""Characters the mount options give a meaning (a list, a key): no path there may hold one."""


@dataclass(frozen=True)
class Overlay:
    """One top-level directory `target` of a member: `lowers`, the layer directories that show it (top first);
    the owner, mode and times its own upper directory's root takes (the template's directory's), so the mount's
    root looks as it did."""

    target: str
    lowers: tuple[str, ...]
    uid: int
    gid: int
    mode: int
    times: tuple[int, int]


def layers_refusal(driver: object, upper: object, lower: object) -> str | None:
    """Why a container whose `GraphDriver` says `driver`, `upper`, `lower` cannot be kept as its own layer here,
    or None (see the module docstring)."""
    if os.geteuid() != 0:
        return "the server does not run as root, so it cannot read the engine's layers"
    if driver != "overlay2":
        return f"the engine's storage driver is {driver!r}, not overlay2"
    if not isinstance(upper, str) or not upper or not os.path.isdir(upper):
        return "the container's writable layer is not a directory this server can read"
    if not isinstance(lower, str) or not lower:
        return "the container's image layers are not known"
    return None


def upper_fs_refusal(state_dir: Path) -> str | None:
    """Why members' upper layers cannot live under `state_dir` (its file system, from the mount table), or None."""
    try:
        table = Path("/proc/self/mounts").read_text()
    except OSError:
        return "the mount table cannot be read"
    target = os.path.realpath(state_dir)
    best, fstype = "", ""
    for line in table.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, fstype = point, fields[2].split(".")[0]
    if fstype in _NO_UPPER:
        return f"the state dir is on {fstype}, which cannot hold an overlay's upper layer"
    return None


def _kind(path: str) -> str | None:
    """'dir', 'opaque' (a directory hiding what is below it), 'other' (a file, a link, a whiteout), or None."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return "other"
    try:
        return "opaque" if os.getxattr(path, _OPAQUE, follow_symlinks=False) == b"y" else "dir"
    except OSError as exc:
        if exc.errno in (errno.ENODATA, errno.ENOTSUP):
            return "dir"
        raise


def _short(layer_diff: str) -> str:
    """`layer_diff` by the engine's short link (`l/XXXX`, which it keeps for its own mount options), if it
    has one that still points there; else itself."""
    layer = os.path.dirname(layer_diff)
    try:
        link = Path(layer, "link").read_text().strip()
    except OSError:
        return layer_diff
    short = os.path.join(os.path.dirname(layer), "l", link)
    with contextlib.suppress(OSError):
        if link and "/" not in link and os.path.samefile(short, layer_diff):
            return short
    return layer_diff


def plan(upper: str, lower: str, own: frozenset[str]) -> tuple[Overlay, ...] | str:
    """The overlays a member of a template kept as the layer `upper` over the image layers `lower` (the
    engine's `LowerDir`, colon-separated, top first) needs, or why there can be none. `own`: the top-level
    names the member itself mounts at or that are the sandbox's machinery (not shown from the template).
    Blocking (reads the layer): run it in a thread."""
    lowers = [_short(path) for path in lower.split(":") if path]
    if any(_UNSAFE & set(path) for path in (upper, *lowers)):
        return "a layer's path holds a character the mount options cannot carry"
    overlays: list[Overlay] = []
    names = sorted(os.listdir(upper))
    if len(names) > _OVERLAYS_MAX:
        return f"setup left {len(names)} top-level entries, more than {_OVERLAYS_MAX} overlays"
    for name in names:
        if name in _KERNEL or name in own:
            continue
        top = os.path.join(upper, name)
        kind = _kind(top)
        shown_top = os.path.join(_short(upper), name)
        if kind not in ("dir", "opaque"):
            return f"setup left /{name} something other than a directory (a file, a link, or deleted it)"
        if _UNSAFE & set(name):
            return f"/{name}: a name the mount options cannot carry"
        shown = [shown_top]
        for layer in lowers if kind == "dir" else []:
            below = _kind(os.path.join(layer, name))
            if below is None:
                continue
            if below == "other":
                break  # a file or a whiteout: nothing further down shows
            shown.append(os.path.join(layer, name))
            if below == "opaque":
                break
        if len(":".join(shown)) > _OPTIONS_MAX - 2 * 200:
            return f"/{name} is shown by more image layers than one mount's options can list"
        st = os.lstat(top)
        overlays.append(Overlay(f"/{name}", tuple(shown), st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode),
                                (st.st_atime_ns, st.st_mtime_ns)))
    return tuple(overlays)


class ForkDir:
    """A member's own host directory holding its overlays' upper and work directories: `<pid>-docker-<hex>`
    under the state dir (mode 0700, the server's), so both reapers remove it after a crash."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def make(cls, state_dir: Path) -> ForkDir:
        path = state_dir / f"{os.getpid()}-docker-{secrets.token_hex(6)}"
        if _UNSAFE & set(str(path)):
            raise SandboxError(f"the state dir {str(state_dir)[:200]!r} holds a character overlay options cannot carry")
        state_dir.mkdir(parents=True, exist_ok=True)
        try:
            path.mkdir(mode=0o700)
        except OSError as exc:
            raise SandboxError(f"cannot make a group member's fork directory: {exc.strerror}") from exc
        return cls(path)

    def mounts(self, overlays: tuple[Overlay, ...]) -> list[docker.types.Mount]:
        """One volume per overlay, its upper and work directories made here (the upper's root with the
        template's directory's owner, mode and times). `SandboxError` when they cannot be made."""
        made = []
        try:
            for i, overlay in enumerate(overlays):
                upper, work = self.path / f"{i}" / "upper", self.path / f"{i}" / "work"
                upper.mkdir(parents=True)
                work.mkdir()
                os.chown(upper, overlay.uid, overlay.gid)
                os.chmod(upper, overlay.mode)
                os.utime(upper, ns=overlay.times)
                options = f"lowerdir={':'.join(overlay.lowers)},upperdir={upper},workdir={work}"
                driver = docker.types.DriverConfig("local", {"type": "overlay", "device": "overlay", "o": options})
                # no_copy: the engine would fill an empty-looking volume with the image's files there, which
                # would bring back what setup deleted.
                made.append(docker.types.Mount(overlay.target, None, type="volume", driver_config=driver,
                                               no_copy=True))
        except OSError as exc:
            raise SandboxError(f"cannot prepare a group member's overlays: {exc.strerror}") from exc
        return made

    def remove(self) -> None:
        with contextlib.suppress(OSError):  # left to the reapers
            remove_tree(self.path)
