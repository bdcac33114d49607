"""Build contexts from clients are unpacked as a stream under running caps (issue 27, item 6): a gzip bomb is
refused as soon as it crosses the size, entry-count or ratio cap, and the work it cost (bytes decompressed, as
the refusal reports) is bounded by the caps, not by what the archive would unpack to. Through `POST /images` the
refusal is a 413 with the reason, and the context's directory is removed."""

from __future__ import annotations

import asyncio
import gzip
import re
import tarfile
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Route

from coding_agent_env.api.images import IMAGES_PATH, ImageBuildRoute
from coding_agent_env.settings.backends import DockerConfig
from coding_agent_env.sandbox.registry import Backends
from coding_agent_env.settings import Settings
from coding_agent_env.tasks.context import ContextError, ContextTooLargeError, UnpackCaps, pack, unpack
from coding_agent_env.tasks.inflate import STEP
from tests.helpers import wait_until

MIB = 1 << 20
_ZEROS = gzip.compress(b"\0" * MIB, compresslevel=9, mtime=0)
"""One MiB of zeros as one gzip member (about 1 KiB): bombs are concatenations of it, cheap to make."""


def _header(name: str, size: int, kind: bytes = tarfile.REGTYPE) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type = size, kind
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def bomb(members: list[tuple[str, int]], kind: bytes = tarfile.REGTYPE) -> bytes:
    """A gzipped tar (concatenated gzip members, as `gzip` reads it) of zero-filled members of whole MiB sizes."""
    parts: list[bytes] = []
    for name, mib in members:
        parts.append(gzip.compress(_header(name, mib * MIB, kind), mtime=0))
        parts.extend([_ZEROS] * mib)
    parts.append(gzip.compress(b"\0" * 1024, mtime=0))  # the end-of-archive blocks
    return b"".join(parts)


def unpacked_bytes(root: Path) -> int:
    return sum(path.stat().st_size for path in root.rglob("*") if path.is_file())


def test_the_bomb_is_what_it_claims() -> None:
    """The test archive is honest: small to send, large unpacked (so bounding its cost means something)."""
    data = bomb([("zeros.bin", 64)])
    assert len(data) < 100_000
    assert len(gzip.decompress(data)) > 64 * MIB


def test_a_bomb_under_the_size_cap_is_refused_by_its_ratio(tmp_path: Path) -> None:
    caps = UnpackCaps(max_bytes=256 * MIB)
    with pytest.raises(ContextTooLargeError, match="compresses more than 200:1") as refused:
        unpack(bomb([("zeros.bin", 200)]), tmp_path, caps)
    assert refused.value.decompressed <= caps.ratio_grace + STEP
    assert f"refused after decompressing {refused.value.decompressed} bytes" in str(refused.value)
    assert unpacked_bytes(tmp_path) <= refused.value.decompressed


def test_the_size_cap_stops_the_stream(tmp_path: Path) -> None:
    """Without the ratio cap, the total size cap stops it: at the first header taking the total over it."""
    caps = UnpackCaps(max_bytes=16 * MIB, max_ratio=float("inf"))
    with pytest.raises(ContextTooLargeError, match=f"unpacks to more than {16 * MIB} bytes") as refused:
        unpack(bomb([(f"part{i}.bin", 1) for i in range(64)]), tmp_path, caps)
    assert 16 * MIB < refused.value.decompressed <= 17 * MIB + STEP
    assert unpacked_bytes(tmp_path) <= 16 * MIB


def test_one_member_over_the_size_cap_is_refused_at_its_header(tmp_path: Path) -> None:
    caps = UnpackCaps(max_bytes=16 * MIB, max_ratio=float("inf"))
    with pytest.raises(ContextTooLargeError, match="unpacks to more than") as refused:
        unpack(bomb([("huge.bin", 64)]), tmp_path, caps)
    assert refused.value.decompressed <= 2 * STEP  # a read-ahead step at most: its 64 MiB never decompressed
    assert unpacked_bytes(tmp_path) == 0


def test_the_entry_count_cap(tmp_path: Path) -> None:
    data = gzip.compress(b"".join(_header(f"f{i}", 0) for i in range(1000)) + b"\0" * 1024, mtime=0)
    caps = UnpackCaps(max_bytes=MIB, max_members=100)
    with pytest.raises(ContextTooLargeError, match="more than 100 entries") as refused:
        unpack(data, tmp_path, caps)
    assert refused.value.decompressed <= 101 * 512 + STEP
    assert len(list(tmp_path.iterdir())) == 100


def test_a_forged_extended_header_cannot_make_the_reader_buffer_it(tmp_path: Path) -> None:
    """A pax header is read into memory whole: one declaring a GiB is stopped by the stream's own cap."""
    forged = bomb([("PaxHeader", 1024)], tarfile.XHDTYPE)
    caps = UnpackCaps(max_bytes=MIB, max_ratio=float("inf"))
    with pytest.raises(ContextTooLargeError, match="unpacks to more than") as refused:
        unpack(forged, tmp_path, caps)
    assert refused.value.decompressed <= caps.max_stream + STEP


def test_a_normal_context_within_the_caps_unpacks(tmp_path: Path) -> None:
    """The caps leave real contexts alone, a plain (not gzipped) tar too."""
    source = tmp_path / "src"
    (source / "sub").mkdir(parents=True)
    (source / "Dockerfile").write_text("FROM scratch\n")
    (source / "sub" / "zeros.bin").write_bytes(b"\0" * (4 * MIB))  # compresses 1000:1, but under the grace
    (tmp_path / "a").mkdir()
    unpack(pack(source), tmp_path / "a", UnpackCaps(max_bytes=8 * MIB))
    assert (tmp_path / "a" / "sub" / "zeros.bin").stat().st_size == 4 * MIB
    (tmp_path / "b").mkdir()
    unpack(gzip.decompress(pack(source)), tmp_path / "b", UnpackCaps(max_bytes=8 * MIB))
    assert (tmp_path / "b" / "Dockerfile").read_text() == "FROM scratch\n"


@pytest.mark.parametrize("data, reason", [
    (gzip.compress(b"x" * 100)[:-30] + b"garbage-garbage-garbage-garbage", "not a readable"),
    (b"\x1f\x8b" + b"\xff" * 64, "not a readable gzip stream"),
    (gzip.compress(b"not a tar at all " * 100), "not a readable tar archive"),
])
def test_malformed_streams_are_refused_not_raised(tmp_path: Path, data: bytes, reason: str) -> None:
    with pytest.raises(ContextError, match=reason) as refused:
        unpack(data, tmp_path, UnpackCaps(max_bytes=MIB))
    assert not isinstance(refused.value, ContextTooLargeError)


def images_app(settings: Settings, max_mb: int) -> tuple[Starlette, Path]:
    """`POST /images` on a server with builds on and a Docker backend named (never reached: it refuses first),
    sent and unpacking at most `max_mb` MiB; and the directory it unpacks contexts in."""
    on = settings.model_copy(update={"image_builds": True, "image_build_max_mb": max_mb}).with_backends(
        *settings.backends, DockerConfig(host="unix:///nonexistent/docker.sock"))
    route = ImageBuildRoute(Backends(on), on)
    return Starlette(routes=[Route(IMAGES_PATH, route.handle, methods=["POST"])]), on.state_dir / "builds"


@pytest.mark.parametrize("max_mb, members, reason, bound", [
    (1, [("zeros.bin", 900)], f"unpacks to more than {MIB} bytes", 2 * STEP),
    (256, [(f"part{i}.bin", 1) for i in range(900)], "compresses more than 200:1", UnpackCaps(MIB).ratio_grace + STEP),
], ids=["one-member-over-the-size-cap", "many-members-under-it-ratio-cap"])
async def test_post_images_refuses_a_bomb_with_413_and_the_work_it_cost(
    settings: Settings, max_mb: int, members: list[tuple[str, int]], reason: str, bound: int
) -> None:
    """A body under 1 MiB that would unpack to 900 MiB: 413, the reason and the bytes decompressed in the
    message, far under what it holds; nothing of it left on the server."""
    app, builds = images_app(settings, max_mb)
    body = bomb(members)
    assert len(body) <= MIB
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://images.test") as client:
        answer = await client.post(IMAGES_PATH, content=body)
    assert answer.status_code == 413, answer.text
    message = answer.json()["error"]["message"]
    assert reason in message
    found = re.search(r"refused after decompressing (\d+) bytes", message)
    assert found and int(found[1]) <= bound, message
    await asyncio.to_thread(wait_until, lambda: not any(builds.iterdir()), what="the context removed")
