"""A Harbor task's Dockerfile as a sandbox without Docker reads it (`tasks.dockerfile`): what is honoured, what is
ignored (and noted), the image's user; and the image map (`tasks.images`): its rules, `FROM` rewriting, the
setting and the flag, and a build whose base image is mapped (the Docker engine, when there is one)."""

from __future__ import annotations

import asyncio
import io
import secrets
import tarfile
from pathlib import Path
from typing import Any

import pytest

from coding_agent_env.errors import SettingsError
from coding_agent_env.settings import DockerConfig, Settings
from coding_agent_env.tasks.context import UnpackCaps, content_hash, image_tag, pack
from coding_agent_env.tasks.dockerfile import IGNORED, Copy, parse_dockerfile
from coding_agent_env.tasks.images import ImageMapError, map_image, mapped_hash, parse_image_map, rewrite_from
from tests.backends.conftest import _docker_host, docker_engine  # noqa: F401 (the engine fixture, last test only)
from tests.backends.rootfs import IMAGE


def test_instructions_that_change_no_file_are_ignored_and_noted() -> None:
    plan = parse_dockerfile(
        "FROM python:3.11\n"
        "LABEL maintainer=x\n"
        "ARG VERSION=1\n"
        "# a comment\n"
        "WORKDIR /app\n"
        "EXPOSE 8080\n"
        "SHELL [\"/bin/bash\", \"-c\"]\n"
        "HEALTHCHECK --interval=5s \\\n"
        "  CMD curl -f http://localhost/ || exit 1\n"
        "VOLUME /data\n"
        "STOPSIGNAL SIGTERM\n"
        "ONBUILD COPY . /src\n"
        "MAINTAINER someone\n"
        "ENTRYPOINT [\"python\"]\n"
        "cmd [\"bash\"]\n"
    )
    assert plan.ignored == ["LABEL (line 2)", "ARG (line 3)", "EXPOSE (line 6)", "SHELL (line 7)",
                            "HEALTHCHECK (line 8)", "VOLUME (line 10)", "STOPSIGNAL (line 11)", "ONBUILD (line 12)",
                            "MAINTAINER (line 13)", "ENTRYPOINT (line 14)", "CMD (line 15)"]
    assert plan.unsupported == [] and plan.workdir == "/app" and plan.copies == [] and plan.user is None
    assert {word.split()[0] for word in plan.ignored} == IGNORED


def test_cmd_alone_is_not_a_refusal_and_run_still_is() -> None:
    assert parse_dockerfile('FROM ubuntu:24.04\nCMD ["bash"]\n').unsupported == []
    plan = parse_dockerfile("FROM ubuntu\nRUN apt-get update\nADD x.tar /opt/\nCOPY --from=build /out /app\n"
                            "FOO bar\n")
    assert plan.unsupported == ["RUN (line 2)", "ADD (line 3)", "COPY (line 4: --from another stage or image)",
                                "FOO (line 5)"]


def test_user_is_the_final_stage_last_one() -> None:
    assert parse_dockerfile("FROM x\nWORKDIR /app\n").user is None
    assert parse_dockerfile("FROM x\nUSER app\nUSER 1001:1001\n").user == "1001"
    assert parse_dockerfile("FROM x\nUSER app:staff\n").user == "app"
    # A build stage's USER does not carry over to the image.
    assert parse_dockerfile("FROM x AS build\nUSER builder\nFROM y\nCOPY a /a\n").user is None
    assert parse_dockerfile("FROM x AS build\nUSER builder\nFROM y\nUSER root\n").user == "root"


def test_copies_keep_absolute_destinations() -> None:
    plan = parse_dockerfile("FROM x\nWORKDIR /app\nCOPY --chown=app:app src/ ./src/\nCOPY data.txt /queries/q.txt\n"
                            "COPY a b /skills/\nWORKDIR sub\nCOPY c .\n")
    assert plan.copies == [Copy(("src/",), "/app/src/"), Copy(("data.txt",), "/queries/q.txt"),
                           Copy(("a", "b"), "/skills/"), Copy(("c",), "/app/sub/")]


def test_a_heredoc_body_is_not_read_as_instructions() -> None:
    plan = parse_dockerfile("FROM x\nRUN <<EOF\nCOPY nothing /here\nUSER ghost\nEOF\nCOPY <<-'END' /etc/x\nhi\nEND\n"
                            "ENV A=1\n")
    assert plan.unsupported == ["RUN (line 2)", "COPY (line 6: heredoc)"]
    assert plan.copies == [] and plan.user is None and plan.env == ["A=1"]


RULES = {
    "python": "mirror.local/python",
    "ghcr.io/org": "registry.local/org",
    "ubuntu:22.04": "local/ubuntu:jammy",
    "myorg": "registry.local/myorg",
    "localhost:5000/": "mirror.local/",
}


@pytest.mark.parametrize(("reference", "mapped"), [
    ("python:3.11-slim", "mirror.local/python:3.11-slim"),  # a repository prefix keeps the tag
    ("python", "mirror.local/python"),
    ("docker.io/library/python:3.12", "mirror.local/python:3.12"),  # compared as Docker reads it in full
    ("python@sha256:" + "a" * 64, "mirror.local/python@sha256:" + "a" * 64),
    ("pythonista:1", "pythonista:1"),  # a prefix ends at a path separator
    ("ubuntu:22.04", "local/ubuntu:jammy"),  # exact
    ("docker.io/library/ubuntu:22.04", "local/ubuntu:jammy"),
    ("ubuntu:24.04", "ubuntu:24.04"),  # an exact rule does not act as a prefix
    ("ghcr.io/org/tool:2", "registry.local/org/tool:2"),
    ("ghcr.io/organisation/tool", "ghcr.io/organisation/tool"),
    ("myorg/tool:1", "registry.local/myorg/tool:1"),
    ("localhost:5000/base:1", "mirror.local/base:1"),
    ("scratch", "scratch"),
    ("$BASE_IMAGE", "$BASE_IMAGE"),
])
def test_map_image_rules(reference: str, mapped: str) -> None:
    assert map_image(reference, RULES) == mapped


def test_the_longest_prefix_wins_and_exact_beats_prefix() -> None:
    rules = {"docker.io": "hub.local/cache", "docker.io/library/python": "py.local/python",
             "python:3.11": "pinned/python:3.11"}
    assert map_image("node:20", rules) == "hub.local/cache/library/node:20"
    assert map_image("python:3.12", rules) == "py.local/python:3.12"
    assert map_image("python:3.11", rules) == "pinned/python:3.11"
    assert map_image("anything", {}) == "anything"


def test_parse_image_map() -> None:
    assert parse_image_map("a=b, c/d=e/f ,") == {"a": "b", "c/d": "e/f"}
    assert parse_image_map(["a=b", "a=c,x=y"]) == {"a": "c", "x": "y"}  # later entries win
    assert parse_image_map(None) == {} and parse_image_map({"a": "b"}) == {"a": "b"}
    for bad in ("python", "=b", "a=", "a b=c", "a=b c"):
        with pytest.raises(ImageMapError):
            parse_image_map(bad)


def test_the_setting_reads_image_map() -> None:
    settings = Settings.from_env({"IMAGE_MAP": "python=mirror.local/python,ubuntu:22.04=local/ubuntu:jammy"})
    assert settings.image_map == {"python": "mirror.local/python", "ubuntu:22.04": "local/ubuntu:jammy"}
    assert Settings.from_env({}).image_map == {}
    with pytest.raises(SettingsError, match="IMAGE_MAP"):
        Settings.from_env({"IMAGE_MAP": "python"})


def test_rewrite_from_keeps_platform_stage_names_and_everything_else() -> None:
    text = ("# syntax=docker/dockerfile:1\n"
            "ARG BASE=python:3.11\n"
            "FROM --platform=linux/amd64 python:3.11-slim AS build\n"
            "RUN echo FROM python:3.11\n"
            "from build as test\n"
            "FROM  ubuntu:22.04\t\r\n"
            "FROM ${BASE}\n"
            "COPY --from=build /out /app\n")
    rewritten, notes = rewrite_from(text, RULES)
    assert rewritten == ("# syntax=docker/dockerfile:1\n"
                         "ARG BASE=python:3.11\n"
                         "FROM --platform=linux/amd64 mirror.local/python:3.11-slim AS build\n"
                         "RUN echo FROM python:3.11\n"
                         "from build as test\n"
                         "FROM  local/ubuntu:jammy\t\r\n"
                         "FROM ${BASE}\n"
                         "COPY --from=build /out /app\n")
    assert notes == ["FROM python:3.11-slim (line 3) -> mirror.local/python:3.11-slim",
                     "FROM ubuntu:22.04 (line 6) -> local/ubuntu:jammy"]
    assert rewrite_from(text, {}) == (text, [])
    assert rewrite_from("FROM node:20\n", RULES) == ("FROM node:20\n", [])


def test_a_mapped_build_gets_its_own_tag() -> None:
    digest = "f" * 64
    assert mapped_hash(digest, "FROM node:20\n", RULES) == digest  # nothing rewritten: the same key
    mapped = mapped_hash(digest, "FROM python:3.11\n", RULES)
    assert mapped != digest and len(mapped) == 64
    assert mapped != mapped_hash(digest, "FROM python:3.11\n", {"python": "other.local/python"})


def test_the_server_maps_before_it_names_the_image(tmp_path: Path) -> None:
    from coding_agent_env.api.images import _prepare

    source = tmp_path / "context"
    source.mkdir()
    (source / "Dockerfile").write_text("FROM python:3.11\nCOPY data.txt /data.txt\n")
    (source / "data.txt").write_text("x\n")
    body = pack(source)
    plain, notes = _prepare(body, tmp_path / "plain", UnpackCaps(1 << 20), {})
    assert plain == image_tag(content_hash(source)) and notes == []
    mapped, notes = _prepare(body, tmp_path / "mapped", UnpackCaps(1 << 20), RULES)
    assert notes == ["FROM python:3.11 (line 1) -> mirror.local/python:3.11"]
    rewritten = (tmp_path / "mapped" / "Dockerfile").read_text()
    assert rewritten == "FROM mirror.local/python:3.11\nCOPY data.txt /data.txt\n"
    assert mapped == image_tag(content_hash(tmp_path / "mapped")) != plain


def test_mapped_context_copies_only_when_it_rewrites(tmp_path: Path) -> None:
    from coding_agent_env.runs.images import mapped_context

    source = tmp_path / "context"
    (source / "sub").mkdir(parents=True)
    (source / "Dockerfile").write_text("FROM python:3.11\nCOPY sub /sub\n")
    (source / "sub" / "f").write_text("f\n")
    assert mapped_context(source, tmp_path / "none", {"node": "n.local/node"}) == []
    assert not (tmp_path / "none").exists()
    assert mapped_context(source, tmp_path / "copy", RULES) == ["FROM python:3.11 (line 1) -> "
                                                                "mirror.local/python:3.11"]
    assert (tmp_path / "copy" / "Dockerfile").read_text() == "FROM mirror.local/python:3.11\nCOPY sub /sub\n"
    assert (tmp_path / "copy" / "sub" / "f").read_text() == "f\n"
    assert (source / "Dockerfile").read_text() == "FROM python:3.11\nCOPY sub /sub\n"  # the task is untouched


def test_a_build_whose_base_image_is_mapped(tmp_path: Path, settings: Settings,
                                            docker_engine: Any) -> None:  # noqa: F811
    """A context `FROM` an image no registry here has, mapped to the suite's offline test image, builds."""
    from coding_agent_env.runs.images import ImageBuilds
    from coding_agent_env.sandbox.registry import Backends

    context = tmp_path / "context"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM private.registry.invalid/team/base:7\nCOPY data.txt /data.txt\n")
    (context / "data.txt").write_text("mapped\n")
    tag = f"coding-agent-env-task:mapped-{secrets.token_hex(6)}"
    docker = settings.with_backends(DockerConfig(host=_docker_host(), image=IMAGE))
    docker = docker.model_copy(update={"image_map": {"private.registry.invalid/team/base:7": IMAGE}})
    try:

        async def build() -> bool:
            async with Backends(docker) as backends:
                return await ImageBuilds(backends).ensure(context, tag)

        assert asyncio.run(build()) is True
        container = docker_engine.containers.create(tag, ["none"], network_mode="none")
        try:
            stream, _ = container.get_archive("/data.txt")
            with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as archive:
                member = archive.extractfile("data.txt")
                assert member is not None and member.read() == b"mapped\n"
        finally:
            container.remove(force=True)
        base = docker_engine.images.get(IMAGE).attrs["RootFS"]["Layers"]
        assert docker_engine.images.get(tag).attrs["RootFS"]["Layers"][: len(base)] == base  # built on the map's
        assert (context / "Dockerfile").read_text().startswith("FROM private.registry.invalid/")
        assert not list((settings.state_dir / "builds").iterdir())  # its private copy is gone
    finally:
        if docker_engine.images.list(name=tag):
            docker_engine.images.remove(tag, force=True)
