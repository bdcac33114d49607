"""Groups on the Docker backend (issue 34): a set-up sandbox frozen into a template, kept as its stopped
container's layer (`layers`, members see it through overlay volumes: the default where the server reads the
engine's layers, as here) or committed into an image (`image`, kind `docker-image`), members forked from it.
Members start from the set-up files (workdir, home, a further root, a tree of thousands of files, what root
wrote in /etc and /opt, what setup deleted or replaced in the image's files), their writes and processes are
their own, their limits and network policy are their own; the template's container or image goes with its
release (or its last member), each member's fork directory with it, a dead server's templates and fork
directories go with the reaper, and a released template forks no more. A setup whose result overlay volumes
cannot show (a new top-level file) is committed instead, or refused when the server is set to `layers`. Real
dockerd (see conftest)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from coding_agent_env.errors import SandboxError, SandboxUnsupportedError
from coding_agent_env.sandbox import Sandbox, SandboxSpec
from coding_agent_env.sandbox.base import SandboxBackend, SandboxLimits, SandboxTemplate
from coding_agent_env.sandbox.docker import LABEL_OWNER, LABEL_ROLLOUT
from coding_agent_env.sandbox.docker.reaper import LABEL_FORKDIR, LABEL_TEMPLATE
from coding_agent_env.sandbox.docker.template import ImageTemplate, LayerTemplate
from coding_agent_env.settings import Settings
from tests.backends.conftest import Target, processes
from tests.backends.rootfs import HOST_BINDS, IMAGE
from tests.backends.test_docker_reaper import record_dead
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


FORK_IMAGE = "coding-agent-env-test-fork:1"
"""The test image with files in the sandbox user's home and in /etc that setup deletes or replaces."""


@pytest.fixture
def layers_here(docker_engine: Any, settings: Settings) -> bool:
    """Whether `DOCKER_FORK=auto` keeps layers on this machine: a root server, the overlay2 driver, a state dir
    that can hold upper layers (CI's and this suite's machines: yes; the tests then hold it to that)."""
    from coding_agent_env.sandbox.docker.layers import upper_fs_refusal

    driver = docker_engine.api.info().get("Driver")
    return os.geteuid() == 0 and driver == "overlay2" and upper_fs_refusal(settings.state_dir) is None


def _expected(kind: str, layers_here: bool) -> str:
    """The method a template of backend kind `kind` is frozen with here."""
    return "image" if kind == "docker-image" or not layers_here else "layers"


def _templates(engine: Any) -> list[str]:
    """This server's template images."""
    return [image.id for image in engine.images.list(filters={"label": [LABEL_TEMPLATE, f"{LABEL_OWNER}={_owner()}"]})]


def _held(engine: Any, template: SandboxTemplate) -> bool:
    """Whether what `template` holds (its image, or its kept container) is still on the engine."""
    if isinstance(template, LayerTemplate):
        return bool(engine.api.containers(all=True, filters={"id": template.container_id}))
    assert isinstance(template, ImageTemplate)
    return bool(engine.images.list(filters={"label": f"{LABEL_TEMPLATE}={template.id}"}))


@pytest.fixture(params=["docker", "docker-exec", "docker-image"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=["docker", "docker-image"])
def method_kind(request: pytest.FixtureRequest) -> str:
    """Each way of freezing, on the control transport."""
    return str(request.param)


@pytest.fixture
def docker_backend(kind: str, backend_for: Callable[..., Target]) -> SandboxBackend:
    return backend_for(kind, sandbox_allow_host_network=True).backends.get("docker")


@pytest.fixture
def no_leftover_fork_dirs(settings: Settings) -> Iterator[None]:
    """Fails the test if a member's fork directory (or any of this backend's directories: every sandbox is
    closed by then) is left under the state dir."""
    yield
    left = [str(path) for path in settings.state_dir.glob(f"{os.getpid()}-docker-*")]
    assert not left, f"fork directories left: {left}"


@pytest.fixture
def no_leftover_templates(docker_engine: Any) -> Iterator[None]:
    """Fails the test if one of this server's template images is left (removing it after the check)."""
    yield
    left = _templates(docker_engine)
    for image in left:
        docker_engine.images.remove(image, force=True)
    assert not left, f"template images left behind: {left}"


@pytest.fixture
async def opened(no_leftover_templates: None, no_leftover_containers: None,
                 no_leftover_fork_dirs: None) -> AsyncIterator[list[Sandbox | SandboxTemplate]]:
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


async def _template(backend: SandboxBackend, made: list[Sandbox | SandboxTemplate], setup: str = SETUP,
                    spec: SandboxSpec | None = None, user: str | None = None) -> SandboxTemplate:
    """A template of a sandbox (of `spec`) set up by `setup` (run as `user`)."""
    box = await backend.create(spec or _spec("fork-template"))
    made.append(box)
    ran = await box.exec(["bash", "-c", setup], timeout=CMD_S, max_output_bytes=OUT, user=user)
    assert ran.exit_code == 0, ran.stdout + ran.stderr
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
    kind: str, docker_backend: SandboxBackend, opened: list[Any], docker_engine: Any, settings: Settings,
    layers_here: bool,
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
    assert template.method == _expected(kind, layers_here)
    if isinstance(template, ImageTemplate):
        config = docker_engine.api.inspect_image(template.image)["Config"]
        # A VOLUME in the template's image would give members fresh anonymous volumes over the binds' paths.
        assert not config.get("Volumes") and config["Labels"][LABEL_TEMPLATE] == template.id
    for box in (one, two):
        assert await _sh(box, seen) == (0, expected)
        assert docker_engine.api.inspect_container(box.id)["Config"]["Labels"][LABEL_TEMPLATE] == template.id

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
        if isinstance(template, LayerTemplate):  # the kept layer itself: never written by a member
            upper = docker_engine.api.inspect_container(template.container_id)["GraphDriver"]["Data"]["UpperDir"]
            assert Path(f"{upper}/home/sandbox/.rc").read_text() == "home\n"
    finally:
        await sleeper.kill()


async def test_members_have_their_own_limits_and_network(
    method_kind: str, backend_for: Callable[..., Target], opened: list[Any], docker_engine: Any, settings: Settings
) -> None:
    backend = backend_for(method_kind, sandbox_allow_host_network=True).backends.get("docker")
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


async def test_release_removes_what_it_holds_with_the_last_member_and_refuses_further_forks(
    method_kind: str, backend_for: Callable[..., Target], opened: list[Any], docker_engine: Any
) -> None:
    backend = backend_for(method_kind).backends.get("docker")
    template = await _template(backend, opened)
    assert _held(docker_engine, template)
    member = await backend.fork(_spec("fork-last"), template)
    opened.append(member)
    inspected = docker_engine.api.inspect_container(member.id)
    forkdir = inspected["Config"]["Labels"].get(LABEL_FORKDIR)
    assert (forkdir is not None) == (template.method == "layers")
    volumes = [m["Name"] for m in inspected["Mounts"] if m["Type"] == "volume"]
    assert len(volumes) == 2 + (len(getattr(template, "overlays", ())))  # workdir, /solution, the overlays
    await template.release()
    await template.release()  # idempotent
    assert _held(docker_engine, template), "removed under an open member"
    with pytest.raises(SandboxUnsupportedError, match="released"):
        await backend.fork(_spec("fork-late"), template)
    assert (await _sh(member, "cat /workspace/set.txt"))[1] == "from-setup\n"
    await member.close()
    assert not _held(docker_engine, template)
    assert forkdir is None or not os.path.exists(forkdir)
    assert not [v for v in volumes if docker_engine.api.volumes(filters={"name": v}).get("Volumes")]
    owned = docker_engine.containers.list(all=True, filters={"label": f"{LABEL_OWNER}={_owner()}"})
    assert not owned


async def test_release_without_members_removes_what_it_holds_at_once(
    method_kind: str, backend_for: Callable[..., Target], opened: list[Any], docker_engine: Any
) -> None:
    backend = backend_for(method_kind).backends.get("docker")
    template = await _template(backend, opened)
    assert _held(docker_engine, template)
    await template.release()
    assert not _held(docker_engine, template)


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
    state_dir = backend_for("docker").settings.state_dir
    record_dead(state_dir, "i", image.id)
    record_dead(state_dir, "c", member.id)
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


async def test_a_cancelled_fork_leaves_nothing_and_the_template_still_goes(
    method_kind: str, backend_for: Callable[..., Target], opened: list[Any], docker_engine: Any
) -> None:
    backend = backend_for(method_kind).backends.get("docker")
    template = await _template(backend, opened)
    forking = asyncio.ensure_future(backend.fork(_spec("fork-cancelled"), template))
    await poll(lambda: asyncio.to_thread(_members, docker_engine, "fork-cancelled"), "the member's container")
    forking.cancel()
    with pytest.raises(asyncio.CancelledError):
        await forking
    await poll(lambda: asyncio.to_thread(lambda: not _members(docker_engine, "fork-cancelled")), "its removal")
    await template.release()
    assert not _held(docker_engine, template)


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


@pytest.fixture(scope="session")
def fork_image(docker_engine: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The test image with files of its own in the sandbox user's home and in /etc (built once, offline)."""
    context = tmp_path_factory.mktemp("fork-image")
    for name, text in {"keep.txt": "kept\n", "gone.txt": "deleted by setup\n", "old.txt": "replaced dir\n",
                       "image.conf": "deleted by root\n"}.items():
        (context / name).write_text(text)
    (context / "Dockerfile").write_text(
        f"FROM {IMAGE}\nCOPY --chown=1000:1000 keep.txt gone.txt /home/sandbox/\n"
        "COPY --chown=1000:1000 old.txt /home/sandbox/dir/old.txt\nCOPY image.conf /etc/image.conf\n")
    docker_engine.images.build(path=str(context), tag=FORK_IMAGE, pull=False, rm=True, forcerm=True)
    return FORK_IMAGE


async def test_members_see_what_setup_deleted_replaced_and_wrote_as_root(
    method_kind: str, backend_for: Callable[..., Target], opened: list[Any], fork_image: str, layers_here: bool
) -> None:
    """The image's own files: one deleted, a directory replaced by a new one, one of root's deleted; root's
    writes in /etc and /opt. A member sees exactly the set-up state (a whiteout or an opaque directory in the
    kept layer means there what it meant in the template)."""
    backend = backend_for(method_kind).backends.get("docker")
    spec = _spec("fork-root", image=fork_image, users=True)
    setup = ("rm /home/sandbox/gone.txt && rm -rf /home/sandbox/dir && mkdir /home/sandbox/dir && "
             "echo new > /home/sandbox/dir/new.txt && chown -R 1000:1000 /home/sandbox/dir && "
             "rm /etc/image.conf && echo by-root > /etc/marker && mkdir -p /opt/tool && echo t > /opt/tool/t")
    template = await _template(backend, opened, setup, spec, user="root")
    assert template.method == _expected(method_kind, layers_here)
    member = await backend.fork(dataclasses.replace(spec, rollout_id="fork-root-member"), template)
    opened.append(member)
    seen = ("cat ~/keep.txt; ls -A ~/dir; ls ~/gone.txt /etc/image.conf 2>&1 | wc -l; cat /etc/marker /opt/tool/t; "
            "ls /home/sandbox/gone.txt >/dev/null 2>&1 || echo gone; stat -c %U:%a ~ /tmp")
    assert await _sh(member, seen) == (0, "kept\nnew.txt\n2\nby-root\nt\ngone\nsandbox:755\nroot:1777\n")
    # Its own writes there: its own (root's too).
    ran = await member.exec(["bash", "-c", "echo mine > /etc/marker && rm ~/keep.txt"], timeout=CMD_S,
                            max_output_bytes=OUT, user="root")
    assert ran.exit_code == 0, ran.stderr
    other = await backend.fork(dataclasses.replace(spec, rollout_id="fork-root-other"), template)
    opened.append(other)
    assert await _sh(other, "cat /etc/marker ~/keep.txt") == (0, "by-root\nkept\n")


async def test_a_setup_the_layers_cannot_show_is_committed_or_refused(
    backend_for: Callable[..., Target], opened: list[Any], docker_engine: Any, layers_here: bool
) -> None:
    """A new file at the top of the file system (no overlay volume can show one): committed under `auto` (the
    member still sees it), refused under `layers` (naming it), leaving nothing either way."""
    if not layers_here:
        pytest.skip("templates are kept as layers only by a root server on overlay2")
    spec = _spec("fork-top", users=True)
    auto = backend_for("docker").backends.get("docker")
    template = await _template(auto, opened, "echo top > /topfile", spec, user="root")
    assert isinstance(template, ImageTemplate) and template.method == "image"
    member = await auto.fork(dataclasses.replace(spec, rollout_id="fork-top-member"), template)
    opened.append(member)
    assert await _sh(member, "cat /topfile") == (0, "top\n")

    strict = backend_for("docker-layers").backends.get("docker")
    box = await strict.create(dataclasses.replace(spec, rollout_id="fork-top-strict"))
    opened.append(box)
    ran = await box.exec(["bash", "-c", "echo top > /topfile"], timeout=CMD_S, max_output_bytes=OUT, user="root")
    assert ran.exit_code == 0
    with pytest.raises(SandboxUnsupportedError, match="/topfile"):
        await strict.snapshot(box)
    assert box.closed and not _members(docker_engine, "fork-top-strict")


async def test_reaper_removes_a_dead_servers_kept_layers_and_fork_dirs(
    backend_for: Callable[..., Target], docker_engine: Any, settings: Settings, tmp_path: Path
) -> None:
    """A dead server's template container and member, and the member's fork directory (only under the state
    dir and named for the dead server: a label elsewhere steers no removal); and its directories no container
    names, if they are older than the reaping server."""
    backend = backend_for("docker").backends.get("docker")
    dead = f"{socket.gethostname()}/{DEAD_PID}"
    forkdir = settings.state_dir / f"{DEAD_PID}-docker-0123456789ab"
    (forkdir / "0" / "upper").mkdir(parents=True)
    decoy = tmp_path / f"{DEAD_PID}-docker-decoy"
    decoy.mkdir()
    made = [
        docker_engine.containers.create(IMAGE, command=["/usr/bin/true"], network_mode="none",
                                        labels={LABEL_ROLLOUT: "group-dead", LABEL_OWNER: dead}),
        docker_engine.containers.create(IMAGE, command=["/usr/bin/true"], network_mode="none",
                                        labels={LABEL_ROLLOUT: "fork-dead", LABEL_OWNER: dead,
                                                LABEL_FORKDIR: str(forkdir)}),
        docker_engine.containers.create(IMAGE, command=["/usr/bin/true"], network_mode="none",
                                        labels={LABEL_ROLLOUT: "fork-decoy", LABEL_OWNER: dead,
                                                LABEL_FORKDIR: str(decoy)}),
    ]
    for container in made[:2]:
        record_dead(settings.state_dir, "c", container.id)
    record_dead(settings.state_dir, "c", made[2].id)
    # Named by no container: one of a dead server's older than this process goes; one made since (a live
    # server's in another pid namespace, say) and one not named as this backend names them stay.
    orphan, fresh, other = (settings.state_dir / f"{DEAD_PID}-docker-{suffix}"
                            for suffix in ("00000000000a", "00000000000b", "notours"))
    for path in (orphan, fresh, other):
        (path / "0").mkdir(parents=True)
    os.utime(orphan, (1_000_000_000, 1_000_000_000))
    os.utime(other, (1_000_000_000, 1_000_000_000))
    try:
        assert await backend.reap_orphans() >= 3
        assert not docker_engine.containers.list(all=True, filters={"label": f"{LABEL_OWNER}={dead}"})
        assert not forkdir.exists() and decoy.is_dir()
        assert not orphan.exists() and fresh.is_dir() and other.is_dir()
    finally:
        for container in made:
            for leftover in docker_engine.containers.list(all=True, filters={"id": container.id}):
                leftover.remove(force=True)
        for path in (orphan, fresh, other):
            shutil.rmtree(path, ignore_errors=True)


def _group_member(index: int) -> Any:
    from coding_agent_env.models import RolloutRequest

    return RolloutRequest.model_validate({
        "instruction": "x", "agent": "oracle", "sandbox": "docker", "image": IMAGE, "group_id": "docker-g",
        "setup": ["mkdir -p pkg && for i in $(seq 50); do echo $i > pkg/$i; done && echo home > ~/set-up"],
        "solution": [f"touch mine-{index}", "cat ~/set-up > seen"],
        "verify": ["test -f pkg/50", "test $(ls mine-* | wc -l) = 1", "grep -q home seen"],
    })


async def test_a_group_of_rollouts_forks_its_members_from_the_kept_layer(
    backend_for: Callable[..., Target], settings: Settings, no_leftover_containers: None,
    no_leftover_fork_dirs: None, layers_here: bool,
) -> None:
    """Three rollouts of one group at once: one template (kept as its layer), each member scored on its own
    writes only; the template and every fork directory go once the group is idle."""
    if not layers_here:
        pytest.skip("templates are kept as layers only by a root server on overlay2")
    from coding_agent_env.models import RolloutStatus
    from coding_agent_env.rollout import run_rollout

    target = backend_for("docker", group_idle_s=0.2)
    results = await asyncio.gather(*(run_rollout(_group_member(i), backends=target.backends) for i in range(3)))
    for result in results:
        assert result.status is RolloutStatus.COMPLETED and result.reward == 1.0, result.error
        assert result.group is not None and result.group.setup == "forked" and result.group.method == "layers"
    assert len({r.group.template for r in results if r.group}) == 1
    assert sum(bool(r.group and r.group.made_here) for r in results) == 1
    await poll(lambda: not len(target.backends.templates), "the idle template's release")
    await target.backends.templates.drain()


async def test_idle_docker_templates_are_bounded_as_local_ones(
    backend_for: Callable[..., Target], no_leftover_containers: None, no_leftover_fork_dirs: None,
    no_leftover_templates: None,
) -> None:
    """Issue 42 item 7 (as item 3): idle Docker templates were uncapped (6 x 150 MB at concurrency 2). With one
    template allowed and a bytes budget: a second group evicts the first, idle, template at once (least recently
    used), their layers are measured, and a group whose template would be one too many sets up per member."""
    from coding_agent_env.models import RolloutStatus
    from coding_agent_env.rollout import run_rollout

    target = backend_for("docker", group_idle_s=600.0, group_max_templates=1)
    templates = target.backends.templates

    def member(group: str) -> Any:
        return _group_member(0).model_copy(update={"group_id": group, "setup": [
            "head -c 3000000 /dev/urandom > ~/blob && mkdir -p pkg && for i in $(seq 50); do echo $i > pkg/$i; done "
            "&& echo home > ~/set-up"]})

    first = await run_rollout(member("docker-a"), backends=target.backends)
    assert first.group and first.group.setup == "forked" and templates.counts().held == 1
    assert templates.counts().bytes >= 3_000_000  # the kept layer, measured
    second = await run_rollout(member("docker-b"), backends=target.backends)  # evicts docker-a's template
    assert second.group and second.group.setup == "forked" and second.group.made_here
    assert templates.counts().held == 1
    blocked = asyncio.ensure_future(run_rollout(member("docker-c").model_copy(
        update={"solution": ["sleep 5", "touch mine-0", "cat ~/set-up > seen"]}), backends=target.backends))
    await poll(lambda: templates.counts().idle == 0, "docker-c's template in use", timeout_s=60)
    beyond = await run_rollout(member("docker-d"), backends=target.backends)
    assert beyond.group and beyond.group.setup == "per_member"
    assert "GROUP_MAX_TEMPLATES" in (beyond.group.note or "")
    for result in (first, second, await blocked, beyond):
        assert result.status is RolloutStatus.COMPLETED and result.reward == 1.0, result.error
    await templates.aclose()


_CRASHING_SERVER = """
import asyncio, sys
from coding_agent_env.models import RolloutRequest
from coding_agent_env.rollout import run_rollout
from coding_agent_env.sandbox import Backends
from coding_agent_env.settings import Settings

async def main():
    async with Backends(Settings.from_env()) as backends:
        request = RolloutRequest(instruction="x", agent="oracle", group_id="g", setup=["echo set > ~/s"],
                                 solution=["sleep 300"], verify=["true"], sandbox="docker")
        await asyncio.gather(*(run_rollout(request, backends=backends) for _ in range(3)))

asyncio.run(main())
"""


async def test_a_server_killed_mid_group_leaves_nothing_after_its_restart(
    backend_for: Callable[..., Target], settings: Settings, docker_engine: Any, layers_here: bool
) -> None:
    """kill -9 of a server whose group runs (its template kept as a stopped container, three members with their
    fork directories): the next start's reaper removes all of it."""
    if not layers_here:
        pytest.skip("templates are kept as layers only by a root server on overlay2")
    import signal
    import subprocess
    import sys

    from tests.backends.conftest import _docker_host

    env = {**os.environ, "STATE_DIR": str(settings.state_dir), "SANDBOX_BACKENDS": "docker,local",
           "DOCKER_HOST": _docker_host(), "DOCKER_IMAGE": IMAGE, "DOCKER_HOST_BINDS": ",".join(HOST_BINDS)}
    server = subprocess.Popen([sys.executable, "-c", _CRASHING_SERVER], env=env, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    owned = f"{LABEL_OWNER}={socket.gethostname()}/{server.pid}"

    def forkdirs() -> list[Path]:
        return [p for p in settings.state_dir.glob(f"{server.pid}-docker-*") if (p / "0").exists()]

    try:
        def running() -> bool:
            assert server.poll() is None, server.stderr.read() if server.stderr else ""
            found = docker_engine.api.containers(all=True, filters={"label": owned})
            return len(found) >= 4 and len(forkdirs()) >= 3  # the kept template and three members

        await poll(lambda: asyncio.to_thread(running), "a group running", timeout_s=120)
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        if server.stderr:
            server.stderr.close()
    try:
        assert docker_engine.api.containers(all=True, filters={"label": owned})  # the crash left them
        restarted = backend_for("docker").backends.get("docker")
        assert await restarted.reap_orphans() >= 4
        assert not docker_engine.api.containers(all=True, filters={"label": owned})
        assert not list(settings.state_dir.glob(f"{server.pid}-docker-*"))
    finally:
        for found in docker_engine.api.containers(all=True, filters={"label": owned}):
            docker_engine.api.remove_container(found["Id"], force=True, v=True)


async def test_top_level_names_that_are_not_printable_utf8_are_committed_and_leak_nothing(
    backend_for: Callable[..., Target], opened: list[Any], docker_engine: Any, layers_here: bool
) -> None:
    """Issue 42 item 7: a setup's top-level directory named by bytes no UTF-8 decodes (beside its U+FFFD twin),
    or by a control character: on `main` every member failed and each attempt leaked two volumes. Such a layer
    is committed (never mounted): the member sees both directories as setup left them, no volume is left."""
    if not layers_here:
        pytest.skip("templates are kept as layers only by a root server on overlay2")
    volumes = {v["Name"] for v in docker_engine.api.volumes().get("Volumes") or []}
    backend = backend_for("docker").backends.get("docker")
    setup = ("mkdir $'/\\xff' $'/\\xef\\xbf\\xbd' $'/tab\\tname' && "
             "echo a > $'/\\xff/f' && echo b > $'/\\xef\\xbf\\xbd/f'")
    spec = _spec("fork-odd", users=True)
    template = await _template(backend, opened, setup, spec, user="root")
    assert isinstance(template, ImageTemplate) and template.method == "image"
    member = await backend.fork(dataclasses.replace(spec, rollout_id="fork-odd-member"), template)
    opened.append(member)
    assert await _sh(member, "cat $'/\\xff/f' $'/\\xef\\xbf\\xbd/f' && test -d $'/tab\\tname'") == (0, "a\nb\n")
    await member.close()
    await template.release()

    def left() -> list[str]:
        return sorted({v["Name"] for v in docker_engine.api.volumes().get("Volumes") or []} - volumes)

    # The engine removes a container's volumes with it, and the template's set-up container goes as it is released:
    # on a loaded engine that can finish a moment after `release` returns.
    await poll(lambda: asyncio.to_thread(lambda: not left()), lambda: f"volumes left: {left()}", timeout_s=60)


async def test_two_mounts_at_one_target_are_refused_before_anything_is_made(
    backend_for: Callable[..., Target], docker_engine: Any, no_leftover_containers: None
) -> None:
    """Two mounts at one path (here an operator's bind given twice, `/usr` and `/usr/`; in a member, two overlay
    targets that would meet): refused by the server before the engine makes a container or a volume (an engine
    refusing them itself leaves the volumes it made first)."""
    from coding_agent_env.sandbox.docker import DockerBackend

    target = backend_for("docker")
    config = target.settings.backend_config("docker").model_copy(update={"host_binds": (*HOST_BINDS, "/usr/")})
    backend = DockerBackend(config, target.settings)  # type: ignore[arg-type]
    volumes = {v["Name"] for v in docker_engine.api.volumes().get("Volumes") or []}
    try:
        with pytest.raises(SandboxError, match="two mounts at '/usr'"):
            await backend.create(_spec("fork-twice"))
    finally:
        await backend.aclose()
    assert not _members(docker_engine, "fork-twice")
    assert {v["Name"] for v in docker_engine.api.volumes().get("Volumes") or []} <= volumes
