"""`layers.plan`: which overlay volumes show a kept template layer to a member, read the way the kernel reads
overlay layers (a whiteout or a file stops the descent, an opaque directory hides what is below it), and what it
refuses (a top-level file or deletion, a path the mount options cannot carry). On real directories with real
whiteouts (character devices 0/0) and `trusted.overlay.opaque` marks: needs root, as the backend does."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from coding_agent_env.errors import SandboxUnavailableError
from coding_agent_env.sandbox.docker.layers import ForkDir, layers_refusal, plan, same_files_refusal, upper_fs_refusal

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="whiteouts and trusted.* xattrs need root")

ROOM = 100
"""A member's upper and work directory paths' length."""


def _layer(root: Path, name: str, dirs: tuple[str, ...] = (), whiteouts: tuple[str, ...] = (),
           opaque: tuple[str, ...] = (), files: tuple[str, ...] = ()) -> Path:
    """An engine-like layer `<root>/<name>/diff` (with its short link `l/<NAME>`)."""
    diff = root / name / "diff"
    diff.mkdir(parents=True)
    for d in dirs:
        (diff / d).mkdir(parents=True, exist_ok=True)
    for f in files:
        (diff / f).parent.mkdir(parents=True, exist_ok=True)
        (diff / f).write_text(f)
    for w in whiteouts:
        os.mknod(diff / w, stat.S_IFCHR | 0o600, os.makedev(0, 0))
    for o in opaque:
        (diff / o).mkdir(parents=True, exist_ok=True)
        os.setxattr(diff / o, "trusted.overlay.opaque", b"y")
    (root / "l").mkdir(exist_ok=True)
    short = name.upper()[:26]
    (root / "l" / short).symlink_to(f"../{name}/diff")
    (root / name / "link").write_text(short)
    return diff


def test_each_top_level_directory_is_shown_by_the_layers_that_hold_it(tmp_path: Path) -> None:
    upper = _layer(tmp_path, "upper", dirs=("home/sandbox", "etc", "workspace", ".coding-agent-env"),
                   opaque=("opt",))
    mid = _layer(tmp_path, "mid", dirs=("etc", "opt", "srv"), whiteouts=("home",))
    base = _layer(tmp_path, "base", dirs=("home/sandbox", "etc", "opt", "proc"))
    os.chmod(upper / "home", 0o751)
    planned = plan(str(upper), f"{mid}:{base}", frozenset({"workspace", ".coding-agent-env"}), ROOM)
    assert not isinstance(planned, str), planned
    shown = {o.target: [Path(p).resolve() for p in o.lowers] for o in planned}
    # /home: the template's only (the middle layer deleted it: the base's is not shown);
    # /etc: all three; /opt: the template's only (opaque); the member's own and untouched ones: none.
    assert shown == {"/home": [upper / "home"], "/etc": [upper / "etc", mid / "etc", base / "etc"],
                     "/opt": [upper / "opt"]}
    home = next(o for o in planned if o.target == "/home")
    assert home.mode == 0o751 and (home.uid, home.gid) == (0, 0)
    # The engine's short links, where they resolve to the layer (shorter mount options).
    assert all("/l/" in p for o in planned for p in o.lowers)


@pytest.mark.parametrize(("make", "why"), [
    (lambda up: (up / "topfile").write_text("x"), "/topfile"),
    (lambda up: os.mknod(up / "srv", stat.S_IFCHR | 0o600, os.makedev(0, 0)), "/srv"),
    (lambda up: (up / "link").symlink_to("/etc"), "/link"),
    (lambda up: (up / "a,b").mkdir(), "a,b"),
])
def test_what_no_overlay_volume_can_show_is_refused(tmp_path: Path, make: Callable[[Path], object],
                                                    why: str) -> None:
    upper = _layer(tmp_path, "upper", dirs=("home",))
    base = _layer(tmp_path, "base", dirs=("srv",))
    make(upper)
    planned = plan(str(upper), str(base), frozenset(), ROOM)
    assert isinstance(planned, str) and why in planned


def test_a_layer_path_the_options_cannot_carry_is_refused(tmp_path: Path) -> None:
    upper = _layer(tmp_path, "up:per", dirs=("home",))
    (tmp_path / "up:per" / "link").unlink()  # no short link to hide the colon behind
    assert "cannot carry" in str(plan(str(upper), str(_layer(tmp_path, "base")), frozenset(), ROOM))


def test_refusals_name_what_is_missing(tmp_path: Path) -> None:
    assert "overlay2" in str(layers_refusal("vfs", str(tmp_path), "/x"))
    assert "writable layer" in str(layers_refusal("overlay2", str(tmp_path / "nowhere"), "/x"))
    assert layers_refusal("overlay2", str(tmp_path), "/x") is None


def test_a_fork_dir_gives_each_overlay_its_upper_with_the_templates_owner_and_mode(tmp_path: Path) -> None:
    upper = _layer(tmp_path, "upper", dirs=("tmp",))
    os.chmod(upper / "tmp", 0o1777)
    os.chown(upper / "tmp", 1000, 1000)
    planned = plan(str(upper), str(_layer(tmp_path, "base")), frozenset(), ROOM)
    assert not isinstance(planned, str)
    forkdir = ForkDir.make(tmp_path / "state")
    try:
        (mount,) = forkdir.mounts(planned)
        made = forkdir.path / "0" / "upper"
        st = made.stat()
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o1777, 1000, 1000)
        options = mount["VolumeOptions"]["DriverConfig"]["Options"]
        assert mount["Target"] == "/tmp" and mount["VolumeOptions"]["NoCopy"] is True
        assert options["type"] == "overlay" and f"upperdir={made}," in options["o"]
        assert stat.S_IMODE(forkdir.path.stat().st_mode) == 0o700
    finally:
        forkdir.remove()
    assert not forkdir.path.exists()


def test_a_state_dir_on_an_overlay_cannot_hold_upper_layers(tmp_path: Path) -> None:
    """Members' upper layers live under the state dir: one on an overlay (a server in a container, say) is
    refused, found in the mount table (a real overlay mounted here); a plain disk or tmpfs is fine."""
    assert upper_fs_refusal(tmp_path) is None
    for name in ("lower", "upper", "work", "merged"):
        (tmp_path / name).mkdir()
    options = f"lowerdir={tmp_path / 'lower'},upperdir={tmp_path / 'upper'},workdir={tmp_path / 'work'}"
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(tmp_path / "merged")], check=True)
    try:
        (tmp_path / "merged" / "state").mkdir()
        assert "overlay" in str(upper_fs_refusal(tmp_path / "merged" / "state"))
    finally:
        subprocess.run(["umount", str(tmp_path / "merged")], check=True)


def test_records_of_renames_across_directories_are_refused(tmp_path: Path) -> None:
    """Where the kernel (or the engine's mount options) records renamed directories, a directory renamed across
    directories is recorded by its path from the root, which a member's mount at one top-level directory cannot
    resolve: refused (the template is then committed). A rename within its directory (a relative record)
    still resolves; a record under a directory the member mounts itself is not looked at."""
    upper = _layer(tmp_path, "upper", dirs=("home/sandbox/moved", "home/sandbox/renamed", "workspace/x"))
    base = _layer(tmp_path, "base", dirs=("home/sandbox",))
    os.setxattr(upper / "home/sandbox/renamed", "trusted.overlay.redirect", b"old-name")
    os.setxattr(upper / "workspace/x", "trusted.overlay.redirect", b"/elsewhere")
    assert not isinstance(plan(str(upper), str(base), frozenset({"workspace"}), ROOM), str)
    os.setxattr(upper / "home/sandbox/moved", "trusted.overlay.redirect", b"/opt/elsewhere")
    assert "renamed a directory" in str(plan(str(upper), str(base), frozenset({"workspace"}), ROOM))


def test_too_many_top_level_entries_or_too_long_options_are_refused(tmp_path: Path) -> None:
    upper = _layer(tmp_path, "upper", dirs=tuple(f"d{i}" for i in range(70)))
    assert "more than 64" in str(plan(str(upper), str(_layer(tmp_path, "base")), frozenset(), ROOM))
    few = _layer(tmp_path, "few", dirs=("home",))
    assert "options" in str(plan(str(few), str(_layer(tmp_path, "b2")), frozenset(), 2000))


def test_the_daemon_is_asked_who_serves_its_socket(tmp_path: Path) -> None:
    """A socket served by a process of this namespace as root (this test, as root): fine; no socket: not known
    now (asked again next time), saying why."""
    import socket

    path = tmp_path / "d.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(str(path))
        server.listen(1)
        assert same_files_refusal(str(path)) is None
    finally:
        server.close()
    with pytest.raises(SandboxUnavailableError, match="cannot say who serves it"):
        same_files_refusal(str(tmp_path / "none.sock"))
