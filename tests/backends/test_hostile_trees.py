"""The tree remover (`launcher/inside/treeops`) on trees a sandbox could make, run as a non-root server would
(a plain uid: no capability overrides the modes a sandboxed process set): any depth, permissions taken away,
symlinks out (never followed), FIFOs; nothing is left, and what the symlinks point at is untouched."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from coding_agent_env.sandbox.launcher.inside import treeops

_NOBODY = 65534

_REMOVE_AS = """
import os, sys
from coding_agent_env.sandbox.launcher.inside.treeops import remove_tree  # imported first: nobody reads the venv
os.setgroups([]); os.setgid(int(sys.argv[2])); os.setuid(int(sys.argv[2]))
remove_tree(sys.argv[1])
"""


def _make_tree(top: Path, depth: int, outside: Path) -> None:
    """`top` made `depth` deep (by descriptor: deeper than a path can name), with a file, FIFO and symlink out
    at every hundredth level, and directories stripped of every permission on the way back up."""
    os.mkdir(top)
    fds = [os.open(top, os.O_RDONLY | os.O_DIRECTORY)]
    try:
        for i in range(depth):
            os.mkdir("d", dir_fd=fds[-1])
            if i % 100 == 0:
                os.close(os.open("f", os.O_WRONLY | os.O_CREAT, 0o000, dir_fd=fds[-1]))
                os.mkfifo("p", dir_fd=fds[-1])
                os.symlink(str(outside), "out", dir_fd=fds[-1])
            nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fds[-1])
            if len(fds) > 1:
                os.close(fds.pop())  # keep the top and the current one open only
            fds.append(nxt)
    finally:
        for fd in fds:
            os.close(fd)


def _chown_tree(top: Path, uid: int) -> None:
    subprocess.run(["chown", "-R", "-h", f"{uid}:{uid}", str(top)], check=True)
    subprocess.run(["find", str(top), "-mindepth", "1", "-type", "d", "-name", "d", "-execdir", "chmod", "000",
                    "{}", "+"], check=True)


@pytest.mark.parametrize("depth", [3000, 10000])
def test_a_deep_tree_is_removed_in_place_whatever_its_depth(state_dir: Path, depth: int) -> None:
    outside = state_dir / "outside"
    outside.mkdir()
    (outside / "keep").write_text("keep")
    _make_tree(state_dir / "tree", depth, outside)
    treeops.remove_tree(state_dir / "tree")  # (the state dir's own teardown would recurse: it must go here)
    assert not (state_dir / "tree").exists()
    assert (outside / "keep").read_text() == "keep"


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a tree of another uid and removes it as that uid")
def test_a_non_root_remover_gets_through_directories_without_permissions(state_dir: Path) -> None:
    outside = state_dir / "outside"  # the state dir (0711): a path the remover's uid can traverse
    outside.mkdir()
    (outside / "keep").write_text("keep")
    work = state_dir / "work"
    work.mkdir()
    top = work / "tree"
    _make_tree(top, 3000, outside)
    _chown_tree(work, _NOBODY)
    os.chmod(top, 0o000)
    try:
        done = subprocess.run([sys.executable, "-c", _REMOVE_AS, str(top), str(_NOBODY)], capture_output=True,
                              text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    finally:
        left = top.exists()
        treeops.remove_tree(work)  # as root, whatever the child left (the fixture's rmtree would recurse)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not left
    assert (outside / "keep").read_text() == "keep"


def test_a_file_or_symlink_or_nothing_is_fine(state_dir: Path) -> None:
    (state_dir / "f").write_text("x")
    os.symlink(state_dir / "f", state_dir / "link")
    treeops.remove_tree(state_dir / "link")
    assert (state_dir / "f").exists() and not os.path.lexists(state_dir / "link")
    treeops.remove_tree(state_dir / "f")
    treeops.remove_tree(state_dir / "missing" / "deeper")
    assert list(state_dir.iterdir()) == []
