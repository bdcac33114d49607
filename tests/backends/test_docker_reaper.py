"""The Docker backend's startup reaper (INTEGRITY 16): containers left by a server that died on this host are
removed with their host directories; a live server's containers, and any directory a label points outside the
state dir, are left alone. Real dockerd (see conftest)."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from coding_agent_env.sandbox.docker import LABEL_HOSTDIR, LABEL_OWNER, LABEL_ROLLOUT
from tests.backends.conftest import Target
from tests.backends.rootfs import IMAGE

DEAD_PID = 2**22 + 1
"""Above the largest pid_max Linux allows: never a live process."""


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
    try:
        reaped = await backends.get(name).reap_orphans()
        remaining = {c.id for c in docker_engine.containers.list(all=True, filters={"label": LABEL_ROLLOUT})}
        assert reaped == 2 and orphan.id not in remaining and misled.id not in remaining and live.id in remaining
        assert not ours.exists() and decoy.exists()
    finally:
        live.remove(force=True)  # before the fixtures' own leftover check, which would count it
