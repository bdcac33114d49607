"""The Docker backend's startup reaper (INTEGRITY 16): containers a server that died on this host recorded making
(`records`, in the state dir) are removed with their host directories; a live server's containers, any directory
a label points outside the state dir, and whatever a label alone claims (a task image's Dockerfile can set ours:
issue 42 item 7) are left alone. Real dockerd (see conftest)."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from coding_agent_env.sandbox.docker import LABEL_HOSTDIR, LABEL_OWNER, LABEL_ROLLOUT
from coding_agent_env.sandbox.docker.reaper import LABEL_TEMPLATE
from coding_agent_env.sandbox.docker.records import RECORD_DIR, Made
from tests.backends.conftest import Target
from tests.backends.rootfs import IMAGE

DEAD_PID = 2**22 + 1
"""Above the largest pid_max Linux allows: never a live process."""


def record_dead(state_dir: Path, kind: str, object_id: str) -> None:
    """Record `object_id` as the dead server `DEAD_PID` would have, as it made it."""
    server = state_dir / RECORD_DIR / f"{DEAD_PID}-1"
    server.mkdir(parents=True, exist_ok=True)
    (server / f"{kind}-{object_id.removeprefix('sha256:')}").touch()


@pytest.fixture
def made(docker_engine: Any) -> Iterator[list[Any]]:
    containers: list[Any] = []
    yield containers
    for container in containers:
        try:
            container.remove(force=True)
        except Exception:  # already reaped: the point of the test
            pass


async def test_reaper_removes_a_dead_servers_containers_and_only_its_own_dirs(
    backend_for: Callable[[str], Target], docker_engine: Any, made: list[Any], tmp_path: Path
) -> None:
    name, settings, backends = backend_for("docker")
    host = socket.gethostname()
    ours = settings.state_dir / f"{DEAD_PID}-docker-0123456789ab"
    decoy = tmp_path / f"{DEAD_PID}-docker-decoy"  # right name, wrong place: a label must not steer rmtree
    for path in (ours, decoy):
        (path / "inner").mkdir(parents=True)

    def create(owner_pid: int, hostdir: Path | None) -> Any:
        labels = {LABEL_ROLLOUT: "reaper-test", LABEL_OWNER: f"{host}/{owner_pid}"}
        if hostdir is not None:
            labels[LABEL_HOSTDIR] = str(hostdir)
        container = docker_engine.containers.create(IMAGE, command=["/usr/bin/true"], labels=labels,
                                                    network_mode="none")
        made.append(container)
        return container

    orphan, misled, live = create(DEAD_PID, ours), create(DEAD_PID, decoy), create(os.getpid(), None)
    for dead in (orphan, misled):
        record_dead(settings.state_dir, "c", dead.id)
    Made(settings.state_dir).add("c", live.id)  # this live process's
    try:
        reaped = await backends.get(name).reap_orphans()
        remaining = {c.id for c in docker_engine.containers.list(all=True, filters={"label": LABEL_ROLLOUT})}
        assert reaped == 2 and orphan.id not in remaining and misled.id not in remaining and live.id in remaining
        assert not ours.exists() and decoy.exists()
    finally:
        live.remove(force=True)  # before the fixtures' own leftover check, which would count it


async def test_a_task_image_labelled_as_a_dead_servers_template_is_not_reaped(
    backend_for: Callable[[str], Target], docker_engine: Any, made: list[Any]
) -> None:
    """A task's Dockerfile may say `LABEL coding-agent-env.template=... coding-agent-env.owner=HOST/PID` (a dead
    pid): on `main` the reaper deleted that freshly built image (and the rollout then failed). Nothing unrecorded
    goes: the image, and a container of it labelled as a dead server's, stay; the record's own objects go."""
    name, settings, backends = backend_for("docker")
    dead = f"{socket.gethostname()}/{DEAD_PID}"
    labels = {LABEL_OWNER: dead, LABEL_TEMPLATE: "forged", LABEL_ROLLOUT: "forged"}
    source = docker_engine.containers.create(IMAGE, command=["/usr/bin/true"], network_mode="none")
    made.append(source)
    task_image = source.commit(conf={"Labels": labels})
    forged = docker_engine.containers.create(task_image.id, command=["/usr/bin/true"], network_mode="none",
                                             labels=labels)
    made.append(forged)
    ours = docker_engine.containers.create(IMAGE, command=["/usr/bin/true"], network_mode="none",
                                           labels={LABEL_ROLLOUT: "reaper-test", LABEL_OWNER: dead})
    made.append(ours)
    record_dead(settings.state_dir, "c", ours.id)
    try:
        assert await backends.get(name).reap_orphans() == 1
        assert docker_engine.images.get(task_image.id).id == task_image.id
        remaining = {c.id for c in docker_engine.containers.list(all=True)}
        assert forged.id in remaining and ours.id not in remaining
        assert not (settings.state_dir / RECORD_DIR / f"{DEAD_PID}-1").exists()  # done with: gone
    finally:
        forged.remove(force=True)
        docker_engine.images.remove(task_image.id, force=True)


async def test_a_create_that_fails_leaves_no_record(backend_for: Callable[[str], Target], docker_engine: Any) -> None:
    """Every container is recorded before it is made; a create the engine refuses (here an image it does not
    have, and no registry) made nothing, so its record goes with it: a record left would count as a container
    left (and keep the reaper looking for it), as the soak's random cancellations showed."""
    from coding_agent_env.errors import SandboxError
    from coding_agent_env.sandbox.base import SandboxSpec

    name, settings, backends = backend_for("docker")
    with pytest.raises(SandboxError):
        await backends.get(name).create(SandboxSpec(rollout_id="record-refused", image="cae-test/absent:none"))
    records = settings.state_dir / RECORD_DIR
    assert not [path.name for path in records.glob("*/*")], "a record of a container never made"
