"""Build contexts (`tasks.context`): the hash names the content wherever it is computed, the archive carries it
exactly, and an archive that is not a clean build context is refused with the reason."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from coding_agent_env.tasks.context import ContextError, content_hash, pack, unpack


def tree(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "Dockerfile").write_text("FROM scratch\nCOPY run.sh /run.sh\n")
    (root / "run.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(root / "run.sh", 0o755)
    (root / "sub" / "data.bin").write_bytes(bytes(range(256)) * 40)
    return root


def test_the_archive_carries_the_content_and_its_hash(tmp_path: Path) -> None:
    source = tree(tmp_path / "src")
    data = pack(source)
    assert pack(source) == data  # deterministic: no times, owners or order from the file system
    (tmp_path / "out").mkdir()
    unpack(data, tmp_path / "out", 1 << 20)
    assert content_hash(tmp_path / "out") == content_hash(source)
    assert (tmp_path / "out" / "run.sh").stat().st_mode & 0o111
    os.chmod(source / "run.sh", 0o644)  # the executable bit is part of the content
    assert content_hash(source) != content_hash(tmp_path / "out")


def archive(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as out:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            out.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


@pytest.mark.parametrize("data, reason", [
    (archive((member("../escape"), b"x")), "refused entry"),
    (archive((member("hard", tarfile.LNKTYPE, "../outside"), None)), "not a regular file"),
    (archive((member("link", tarfile.SYMTYPE, "/etc/passwd"), None)), "not a regular file"),
    (archive((member("dev", tarfile.CHRTYPE), None)), "not a regular file"),
    (archive((member("big"), b"x" * 2048)), "more than 1024 bytes"),
    (b"not a tar at all", "not a readable tar archive"),
])
def test_a_bad_archive_is_refused_with_the_reason(tmp_path: Path, data: bytes, reason: str) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(ContextError, match=reason):
        unpack(data, dest, 1024)
    assert not (tmp_path / "escape").exists()


def test_an_absolute_name_lands_inside(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    unpack(archive((member("/etc/evil"), b"x")), dest, 1024)
    assert (dest / "etc" / "evil").read_bytes() == b"x"
