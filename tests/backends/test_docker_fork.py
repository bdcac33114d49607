"""Groups on the Docker backend (issue 34): a set-up sandbox frozen into a template image, members forked from
it. Members start from the set-up files (workdir, home, a further root, a tree of thousands of files), their
writes and processes are their own, their limits and network policy are their own; the image goes with the
template's release (or its last member), a dead server's templates go with the reaper, and a released template
forks no more. Real dockerd (see conftest)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from coding_agent_env.errors import SandboxUnsupportedError
from coding_agent_env.sandbox import Sandbox, SandboxSpec
from coding_agent_env.sandbox.base import SandboxBackend, SandboxLimits, SandboxTemplate
from coding_agent_env.sandbox.docker import LABEL_OWNER, LABEL_ROLLOUT
from coding_agent_env.sandbox.docker.reaper import LABEL_TEMPLATE
from coding_agent_env.settings import Settings
from tests.backends.conftest import Target, processes
from tests.backends.rootfs import IMAGE
from tests.helpers import poll

OUT = 64 * 1024
CMD_S = 60.0
TREE_FILES = 2000
VOLUME_IMAGE = "coding-agent-env-test-volume:1"
"""The test image declaring `VOLUME /data` (a Postgres image declares its data directory so)."""
DEAD_PID = 2**22 + 1
"""Above the largest pid_max Linux allows: never a live process."""
SETUP = (
    "echo from-setup > /workspace/set.txt && mkdir -p /workspace/pkg && "
    "echo home > $HOME/.rc && echo root > /solution/sol.txt && echo tmp > /tmp/t.txt && "
    f"for i in $(seq 1 {TREE_FILES}); do echo $i > /workspace/pkg/f$i; done && "
    "head -c 8000000 /dev/zero > /workspace/pkg/blob.bin"
)


def _owner() -> str:
    return f"{socket.gethostname()}/{os.getpid()}"


def _templates(engine: Any) -> list[str]:
    """This server's template images."""
    return [image.id for image in engine.images.list(filters={"label": [LABEL_TEMPLATE, f"{LABEL_OWNER}={_owner()}"]})]


@pytest.fixture(params=["docker", "docker-exec"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def docker_backend(kind: str, backend_for: Callable[..., Target]) -> SandboxBackend:
    return backend_for(kind, sandbox_allow_host_network=True).backends.get("docker")


@pytest.fixture
def no_leftover_templates(docker_engine: Any) -> Iterator[None]:
    """Fails the test if one of this server's template images is left (removing it after the check)."""
    yield
    left = _templates(docker_engine)
    for image in left:
        docker_engine.images.remove(image, force=True)
    assert not left, f"template images left behind: {left}"


@pytest.fixture
async def opened(no_leftover_templates: None,
                 no_leftover_containers: None) -> AsyncIterator[list[Sandbox | SandboxTemplate]]:
    """Sandboxes and templates a test made: closed and released after it, whatever happened (before the
    leftover checks)."""
    made: list[Sandbox | SandboxTemplate] = []
    yield made
    for thing in reversed(made):
        if isinstance(thing, SandboxTemplate):
            await thing.release()
        else:
            await thing.close()


def _spec(rollout: str, **changes: Any) -> SandboxSpec:
    return SandboxSpec(**{"rollout_id": rollout, "image": IMAGE, "writable_roots": ("/solution",), **changes})


async def _sh(box: Sandbox, command: str) -> tuple[int | None, str]:
    ran = await box.exec(["bash", "-c", command], timeout=CMD_S, max_output_bytes=OUT)
    return ran.exit_code, ran.stdout.decode() + ran.stderr.decode()


async def _template(backend: SandboxBackend, made: list[Sandbox | SandboxTemplate]) -> SandboxTemplate:
    """A template of a sandbox set up by `SETUP`."""
    box = await backend.create(_spec("fork-template"))
    made.append(box)
    code, out = await _sh(box, SETUP)
    assert code == 0, out
    template = await backend.snapshot(box)
    made.append(template)
    assert box.closed
    return template


def _members(engine: Any, rollout: str) -> list[str]:
    """Ids of the containers of `rollout` (one listing: a container removed meanwhile is no error)."""
    return [found["Id"] for found in engine.api.containers(all=True, filters={"label": f"{LABEL_ROLLOUT}={rollout}"})]


@pytest.fixture(scope="session")
def volume_image(docker_engine: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Built once, offline (nothing pulled, no container run)."""
    context = tmp_path_factory.mktemp("volume-image")
    (context / "Dockerfile").write_text(f"FROM {IMAGE}\nVOLUME /data\n")
    docker_engine.images.build(path=str(context), tag=VOLUME_IMAGE, pull=False, rm=True, forcerm=True)
    return VOLUME_IMAGE


async def test_members_start_from_the_setup_and_keep_their_writes_and_processes(
    docker_backend: SandboxBackend, opened: list[Any], docker_engine: Any, settings: Settings
) -> None:
    assert docker_backend.fork_refusal(_spec("probe")) is None
    template = await _template(docker_backend, opened)
    one = await docker_backend.fork(_spec("fork-one"), template)
    opened.append(one)
    two = await docker_backend.fork(_spec("fork-two"), template)
    opened.append(two)
    seen = "cat /workspace/set.txt $HOME/.rc /solution/sol.txt /tmp/t.txt; ls /workspace/pkg | wc -l; " \
           "stat -c %s /workspace/pkg/blob.bin; stat -c %U /workspace /solution"
    expected = f"from-setup\nhome\nroot\ntmp\n{TREE_FILES + 1}\n8000000\nsandbox\nsandbox\n"
    config = docker_engine.api.inspect_image(getattr(template, "image_id"))["Config"]
    # A VOLUME in the template's image would give members fresh anonymous volumes over the binds' paths.
    assert not config.get("Volumes") and config["Labels"][LABEL_TEMPLATE] == template.id
    for box in (one, two):
        assert await _sh(box, seen) == (0, expected)

    assert (await _sh(one, "echo mine > /workspace/set.txt && echo new > /solution/new && rm $HOME/.rc"))[0] == 0
    sleeper = await one.spawn(["sleep", "1000"])
    try:
        three = await docker_backend.fork(_spec("fork-three"), template)
        opened.append(three)
        for box in (two, three):
            untouched = (0, "from-setup\nhome\nsol.txt\n")
            assert await _sh(box, "cat /workspace/set.txt $HOME/.rc; ls /solution") == untouched
            assert not [p for p in processes(box, settings, docker_engine) if "sleep 1000" in p]
        assert [p for p in processes(one, settings, docker_engine) if "sleep 1000" in p], "the test cannot see it"
        assert (await _sh(one, "cat /workspace/set.txt"))[1] == "mine\n"
    finally:
        await sleeper.kill()


async def test_members_have_their_own_limits_and_network(
    backend_for: Callable[..., Target], opened: list[Any], docker_engine: Any, settings: Settings
) -> None:
    backend = backend_for("docker", sandbox_allow_host_network=True).backends.get("docker")
    template = await _template(backend, opened)
    small = dataclasses.replace(SandboxLimits.from_settings(settings), memory_mb=300, max_processes=77)
    big = dataclasses.replace(small, memory_mb=600, max_processes=99)
    lean = await backend.fork(_spec("fork-lean", limits=small), template)
    opened.append(lean)
    wide = await backend.fork(_spec("fork-wide", limits=big, network="host"), template)
    opened.append(wide)
    lean_host = docker_engine.api.inspect_container(lean.id)["HostConfig"]
    wide_host = docker_engine.api.inspect_container(wide.id)["HostConfig"]
    assert (lean_host["PidsLimit"], wide_host["PidsLimit"]) == (77, 99)
    assert lean_host["Memory"] < wide_host["Memory"] and lean.limits["memory"] == lean_host["Memory"]
    assert (lean_host["NetworkMode"], wide_host["NetworkMode"]) == ("none", "host")
    assert (lean.network, wide.network) == ("none", "host")
    labels = docker_engine.api.inspect_container(lean.id)["Config"]["Labels"]
    assert labels[LABEL_ROLLOUT] == "fork-lean" and labels[LABEL_OWNER] == _owner()
    # No network at all in the lean one: not even a loopback route out (only lo exists).
    assert (await _sh(lean, "ls /sys/class/net"))[1].split() == ["lo"]


async def test_release_removes_the_image_with_the_last_member_and_refuses_further_forks(
    backend_for: Callable[..., Target], opened: list[Any], docker_engine: Any
) -> None:
    backend = backend_for("docker").backends.get("docker")
    before = len(_templates(docker_engine))
    template = await _template(backend, opened)
    assert len(_templates(docker_engine)) == before + 1
    member = await backend.fork(_spec("fork-last"), template)
    opened.append(member)
    await template.release()
    await template.release()  # idempotent
    assert len(_templates(docker_engine)) == before + 1, "removed under an open member"
    with pytest.raises(SandboxUnsupportedError, match="released"):
        await backend.fork(_spec("fork-late"), template)
    assert (await _sh(member, "cat /workspace/set.txt"))[1] == "from-setup\n"
    await member.close()
    assert len(_templates(docker_engine)) == before
    owned = docker_engine.containers.list(all=True, filters={"label": f"{LABEL_OWNER}={_owner()}"})
    assert not owned


async def test_release_without_members_removes_the_image_at_once(
    backend_for: Callable[..., Target], opened: list[Any], docker_engine: Any
) -> None:
    backend = backend_for("docker").backends.get("docker")
    before = len(_templates(docker_engine))
    template = await _template(backend, opened)
    await template.release()
    assert len(_templates(docker_engine)) == before


async def test_member_of_another_layout_is_refused(
    backend_for: Callable[..., Target], opened: list[Any]
) -> None:
    backend = backend_for("docker").backends.get("docker")
    template = await _template(backend, opened)
    with pytest.raises(SandboxUnsupportedError, match="another image, workdir"):
        await backend.fork(dataclasses.replace(_spec("fork-other"), writable_roots=()), template)


async def test_reaper_removes_a_dead_servers_templates_and_members(
    backend_for: Callable[..., Target], docker_engine: Any
) -> None:
    backend = backend_for("docker").backends.get("docker")
    dead = f"{socket.gethostname()}/{DEAD_PID}"
    label = f"{LABEL_TEMPLATE}=reaper-test-{os.getpid()}"
    source = docker_engine.containers.create(IMAGE, command=["/usr/bin/true"], network_mode="none")
    try:
        image = source.commit(conf={"Labels": {LABEL_OWNER: dead, LABEL_TEMPLATE: f"reaper-test-{os.getpid()}"}})
    finally:
        source.remove(force=True)
    member = docker_engine.containers.create(image.id, command=["/usr/bin/true"], network_mode="none",
                                             labels={LABEL_ROLLOUT: "fork-reaped", LABEL_OWNER: dead})
    try:
        assert len(docker_engine.images.list(filters={"label": label})) == 1
        assert await backend.reap_orphans() >= 2
        assert not docker_engine.images.list(filters={"label": label})
        assert not docker_engine.containers.list(all=True, filters={"label": f"{LABEL_OWNER}={dead}"})
    finally:
        for leftover in docker_engine.containers.list(all=True, filters={"id": member.id}):
            leftover.remove(force=True)
        for leftover in docker_engine.images.list(filters={"label": label}):
            docker_engine.images.remove(leftover.id, force=True)


async def test_an_image_volume_is_refused_and_leaves_nothing(
    backend_for: Callable[..., Target], opened: list[Any], volume_image: str, docker_engine: Any
) -> None:
    backend = backend_for("docker").backends.get("docker")
    before = len(_templates(docker_engine))
    box = await backend.create(_spec("fork-volume", image=volume_image))
    opened.append(box)
    assert (await _sh(box, "echo x > /workspace/x"))[0] == 0
    assert "VOLUME '/data'" in (backend.fork_refusal(_spec("probe", image=volume_image)) or "")
    with pytest.raises(SandboxUnsupportedError, match="/data"):
        await backend.snapshot(box)
    assert box.closed and not _members(docker_engine, "fork-volume")
    assert len(_templates(docker_engine)) == before


async def test_a_cancelled_fork_leaves_nothing_and_the_image_still_goes(
    backend_for: Callable[..., Target], opened: list[Any], docker_engine: Any
) -> None:
    backend = backend_for("docker").backends.get("docker")
    before = len(_templates(docker_engine))
    template = await _template(backend, opened)
    forking = asyncio.ensure_future(backend.fork(_spec("fork-cancelled"), template))
    await poll(lambda: asyncio.to_thread(_members, docker_engine, "fork-cancelled"), "the member's container")
    forking.cancel()
    with pytest.raises(asyncio.CancelledError):
        await forking
    await poll(lambda: asyncio.to_thread(lambda: not _members(docker_engine, "fork-cancelled")), "its removal")
    await template.release()
    assert len(_templates(docker_engine)) == before


async def test_a_group_on_an_image_docker_cannot_freeze_sets_up_per_member(
    backend_for: Callable[..., Target], volume_image: str, no_leftover_templates: None,
    no_leftover_containers: None,
) -> None:
    """The backend learns of the image's VOLUME only when freezing the first template: the group's members then
    run their setup themselves, each scored, none failed by the refusal."""
    from coding_agent_env.models import RolloutRequest, RolloutStatus
    from coding_agent_env.rollout import run_rollout

    target = backend_for("docker")
    request = RolloutRequest.model_validate({
        "instruction": "x", "agent": "oracle", "sandbox": "docker", "image": volume_image, "group_id": "vol",
        "setup": ["echo set-up > marker"], "solution": ["cat marker > seen"], "verify": ["grep -q set-up seen"],
    })
    results = await asyncio.gather(*(run_rollout(request, backends=target.backends) for _ in range(2)))
    for result in results:
        assert result.status is RolloutStatus.COMPLETED and result.reward == 1.0, result.error
        assert result.group is not None and result.group.setup == "per_member", result.group
        assert "VOLUME" in (result.group.note or "") or "volume" in (result.group.note or "").lower()
