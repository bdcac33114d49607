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
deleted), a top-level name that is not printable strict UTF-8, more top-level directories than `_OVERLAYS_MAX`,
a path the mount options cannot carry, or a record of
a directory renamed across directories or of a metadata-only copy (where the kernel or the engine's mount
options make them), which names a path from the root that a mount at one top-level directory cannot resolve.
Before any of that the backend asks whether the daemon sees this server's files at the same paths at all
(`same_files_refusal`, `upper_fs_refusal`). Nothing in the layer is trusted: it is read without following
links, and only after the template's container is dead (nothing writes it any more). The top-level directories
the member mounts something at itself (its workdir, its further roots, the operator's binds) and the sandbox's
machinery are not mounted over: they are the member's own, as in any sandbox.

A member's writes through these volumes land in its fork directory on the host disk, bounded as its container
layer is (the disk budget bounds the workdir and the further roots only, see `backend`); the directory goes with
the member (and with the reapers, named `<pid>-docker-<hex>` under the state dir like a host directory).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import secrets
import socket
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

import docker.types

from coding_agent_env.errors import SandboxError, SandboxUnavailableError
from coding_agent_env.sandbox.launcher.inside.treeops import remove_tree

__all__ = ["ForkDir", "Overlay", "layers_refusal", "plan", "same_files_refusal", "upper_fs_refusal"]

_KERNEL = frozenset({"proc", "sys", "dev"})
"""Top-level directories the engine mounts the kernel's file systems at: nothing setup wrote is there."""
_OPAQUE = "trusted.overlay.opaque"
_REDIRECT = "trusted.overlay.redirect"
_METACOPY = "trusted.overlay.metacopy"
_WALK_MAX = 1_000_000
"""The most entries of a layer's shown directories searched for the kernel's rename records."""
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


def same_files_refusal(socket_path: str) -> str | None:
    """Why the daemon serving the unix socket `socket_path` may not see this server's files at the same paths
    (its layers, the members' fork directories), or None: its process (the socket's peer) is not visible from
    here (another pid namespace: a server in a container given the host's socket), not root, or in another
    mount namespace. `SandboxUnavailableError` when the socket cannot be asked now (no daemon there)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(5.0)
        sock.connect(socket_path)
        pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise SandboxUnavailableError(f"the daemon's socket cannot say who serves it ({why})") from exc
    finally:
        sock.close()
    if pid <= 0:
        return "the daemon's process is not visible from here (another pid namespace)"
    if uid != 0:
        return "the daemon does not run as root"
    try:
        theirs, ours = os.stat(f"/proc/{pid}/ns/mnt").st_ino, os.stat("/proc/self/ns/mnt").st_ino
    except OSError:
        return "the daemon's mount namespace cannot be read"
    return None if theirs == ours else "the daemon runs in another mount namespace"


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


def plan(upper: str, lower: str, own: frozenset[str], room: int) -> tuple[Overlay, ...] | str:
    """The overlays a member of a template kept as the layer `upper` over the image layers `lower` (the
    engine's `LowerDir`, colon-separated, top first) needs, or why there can be none. `own`: the top-level
    names the member itself mounts at or that are the sandbox's machinery (not shown from the template);
    `room`: the length of a member's upper and work directory paths (its mount options hold them too). The
    directories to show are searched for the kernel's records of directories renamed across directories and of
    metadata-only copies (made where the overlay module or the engine's mount options enable them), which name
    paths from the file system's root that a mount at one top-level directory cannot resolve: any refuses the
    layer. Blocking (reads the layer): run it in a thread. A layer that cannot be read is refused."""
    try:
        return _plan(upper, lower, own, room)
    except OSError as exc:
        return f"the container's layer cannot be read ({exc.strerror})"


def _plan(upper: str, lower: str, own: frozenset[str], room: int) -> tuple[Overlay, ...] | str:
    lowers = [_short(path) for path in lower.split(":") if path]
    if any(_UNSAFE & set(path) for path in (upper, *lowers)):
        return "a layer's path holds a character the mount options cannot carry"
    with os.scandir(upper) as entries:
        # Never more than the cap read: a setup can leave millions of entries.
        names = sorted(entry.name for entry in itertools.islice(entries, _OVERLAYS_MAX + 1))
    if len(names) > _OVERLAYS_MAX:
        return f"setup left more than {_OVERLAYS_MAX} top-level entries (one overlay each)"
    names = [name for name in names if name not in _KERNEL and name not in own]
    odd = next((name for name in names if not _mountable(name)), None)
    if odd is not None:
        return f"setup left a top-level name that is not printable UTF-8 ({_said(odd)}): it is committed, never mounted"
    found = _absolute_records([os.path.join(upper, name) for name in names])
    if found is not None:
        return found
    overlays: list[Overlay] = []
    for name in names:
        top = os.path.join(upper, name)
        kind = _kind(top)
        if kind not in ("dir", "opaque"):
            return f"setup left {_said(name)} something other than a directory (a file, a link, or deleted it)"
        if _UNSAFE & set(name):
            return f"{_said(name)}: a name the mount options cannot carry"
        shown = [os.path.join(_short(upper), name)]
        for layer in lowers if kind == "dir" else []:
            below = _kind(os.path.join(layer, name))
            if below is None:
                continue
            if below == "other":
                break  # a file or a whiteout: nothing further down shows
            shown.append(os.path.join(layer, name))
            if below == "opaque":
                break
        if len("lowerdir=,upperdir=,workdir=") + len(":".join(shown)) + 2 * room > _OPTIONS_MAX:
            return f"{_said(name)} is shown by more image layers than one mount's options can list"
        st = os.lstat(top)
        overlays.append(Overlay(f"/{name}", tuple(shown), st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode),
                                (st.st_atime_ns, st.st_mtime_ns)))
    return tuple(overlays)


def _mountable(name: str) -> bool:
    """Whether a top-level name may be a mount target: strict UTF-8 (a name of other bytes reaches the engine
    as its U+FFFD twin, two such names as one target) and printable."""
    try:
        name.encode("utf-8", errors="strict")  # the bytes no UTF-8 decodes come as lone surrogates, refused here
    except UnicodeEncodeError:
        return False
    return name.isprintable()


def _said(name: str) -> str:
    """A top-level name the sandbox chose, as a message may carry it (printable, bounded)."""
    return ascii("/" + name)[1:-1][:100]


def _absolute_records(tops: list[str]) -> str | None:
    """Why the layer cannot be shown at its top-level directories `tops`: a directory renamed across its parents
    (an absolute `trusted.overlay.redirect`) or a metadata-only copy (`trusted.overlay.metacopy`) under one; or
    None. Walks them without following links, at most `_WALK_MAX` entries (more: refused)."""
    seen = 0
    pending = [top for top in tops if os.path.isdir(top) and not os.path.islink(top)]
    while pending:
        with os.scandir(pending.pop()) as entries:
            for entry in entries:
                seen += 1
                if seen > _WALK_MAX:
                    return f"the layer holds more than {_WALK_MAX} entries to search for renamed directories"
                redirect = _xattr(entry.path, _REDIRECT)
                if (redirect or b"").startswith(b"/") or _xattr(entry.path, _METACOPY) is not None:
                    return "setup renamed a directory across directories, or the kernel copied metadata only"
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
    return None


def _xattr(path: str, name: str) -> bytes | None:
    try:
        return os.getxattr(path, name, follow_symlinks=False)
    except OSError as exc:
        if exc.errno in (errno.ENODATA, errno.ENOTSUP):
            return None
        raise  # unreadable (no right to `trusted.*`, say): the layer is refused, never passed unread


class ForkDir:
    """A member's own host directory holding its overlays' upper and work directories: `<pid>-docker-<hex>`
    under the state dir (mode 0700, the server's), so both reapers remove it after a crash."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @staticmethod
    def room(state_dir: Path) -> int:
        """The length of the longest upper or work directory path a fork dir under `state_dir` gives (`plan`)."""
        return len(str(state_dir / f"{os.getpid()}-docker-{'0' * 12}" / str(_OVERLAYS_MAX) / "upper"))

    @classmethod
    def make(cls, state_dir: Path) -> ForkDir:
        path = state_dir / f"{os.getpid()}-docker-{secrets.token_hex(6)}"
        if _UNSAFE & set(str(path)):
            raise SandboxError(f"the state dir {str(state_dir)[:200]!r} holds a character overlay options cannot carry")
        try:
            state_dir.mkdir(parents=True, exist_ok=True)
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
                if len(options) > _OPTIONS_MAX:
                    raise SandboxError(f"the overlay at {overlay.target} needs longer mount options than fit")
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
