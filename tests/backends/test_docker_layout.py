"""The sandbox a task declares, on the Docker backend: its workdir where it says (`/app`, the image's own files
there still shown, within the disk budget), its further writable roots (`/solution`, `/queries`), `/tests`
only when asked, other users (`exec(user=...)`: root with a default container's capabilities, a name resolved
inside); and the remote backends (hf, e2b) refusing what they cannot honour, naming it, before anything runs.

A small image is built offline from the suite's test image (`tests/backends/rootfs.py`): `WORKDIR /app` with
a file `COPY`d there, one under `/queries`, one too large for a small disk budget elsewhere, and a user
database naming `nobody` and `app` (uid 1234, in group `extra`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from coding_agent_env.errors import SandboxError, SandboxFileError, SandboxUnsupportedError
from coding_agent_env.sandbox import Sandbox, SandboxSpec
from coding_agent_env.sandbox.base import SandboxLimits
from coding_agent_env.sandbox.docker import DockerSandbox
from coding_agent_env.sandbox.docker.layout import PATHS, SandboxLayout
from coding_agent_env.settings import Settings
from tests.backends.conftest import Target
from tests.backends.rootfs import IMAGE
from tests.fakes.e2b_fake import FakeAsyncSandbox

OUT = 64 * 1024
LAYOUT_IMAGE = "coding-agent-env-test-layout:1"
_PASSWD = (
    "root:x:0:0:root:/root:/bin/bash\nsandbox:x:1000:1000:sandbox:/home/sandbox:/bin/bash\n"
    "app:x:1234:1234:app:/home/app:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
)
_GROUP = "root:x:0:\nsandbox:x:1000:\napp:x:1234:\nextra:x:4321:app\nnogroup:x:65534:\n"
_DOCKERFILE = f"""FROM {IMAGE}
COPY passwd /etc/passwd
COPY group /etc/group
COPY queries.txt /queries/q.txt
COPY big.bin /big/big.bin
WORKDIR /app
COPY given.txt /app/given.txt
COPY nested.txt /app/sub/nested.txt
"""


@pytest.fixture(scope="session")
def layout_image(docker_engine: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The test image with a workdir's files (built once, offline: nothing is pulled)."""
    import docker.errors

    try:
        docker_engine.images.get(LAYOUT_IMAGE)
        return LAYOUT_IMAGE
    except docker.errors.ImageNotFound:
        pass
    context = tmp_path_factory.mktemp("layout-image")
    files = {"Dockerfile": _DOCKERFILE, "passwd": _PASSWD, "group": _GROUP, "queries.txt": "from the image\n",
             "given.txt": "given by the image\n", "nested.txt": "nested\n"}
    for name, text in files.items():
        (context / name).write_text(text)
    (context / "big.bin").write_bytes(os.urandom(3 << 20))  # more than a 1 MB disk budget
    docker_engine.images.build(path=str(context), tag=LAYOUT_IMAGE, pull=False, rm=True, forcerm=True)
    return LAYOUT_IMAGE


@pytest.fixture(params=["docker", "docker-exec"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def docker_target(kind: str, backend_for: Callable[..., Target]) -> Target:
    return backend_for(kind)


async def _create(target: Target, spec: SandboxSpec) -> Sandbox:
    box = await target.backends.get("docker").create(spec)
    assert isinstance(box, DockerSandbox)
    return box


async def sh(box: Sandbox, script: str, **kw: Any) -> tuple[int | None, str, str]:
    done = await box.exec([box.shell, "-c", script], timeout=30, max_output_bytes=OUT, **kw)
    return done.exit_code, done.stdout.decode(), done.stderr.decode()


async def _size_of(box: Sandbox, path: str) -> int:
    """The size of the filesystem at `path` in the sandbox."""
    _, out, _ = await sh(box, f"python3 -c \"import os; s = os.statvfs('{path}'); print(s.f_blocks * s.f_frsize)\"")
    return int(out)


def _sized(target: Target) -> bool:
    backend = target.backends.get("docker")
    return bool(getattr(backend, "_sized", False))


# -- the workdir ----------------------------------------------------------------------------------------------


async def test_the_workdir_is_where_the_spec_says_with_the_images_files(
    docker_target: Target, layout_image: str, docker_engine: Any
) -> None:
    box = await _create(docker_target, SandboxSpec(rollout_id="workdir", image=layout_image, workdir="/app"))
    try:
        assert box.paths.workdir == "/app"
        code, out, err = await sh(box, 'pwd; cat given.txt sub/nested.txt; id -u; stat -c %u:%a /app; '
                                       'echo mine > made-by-command.txt; test ! -e /workspace && echo no-workspace')
        assert (code, err) == (0, ""), err
        assert out.splitlines() == ["/app", "given by the image", "nested", "1000", "1000:755", "no-workspace"]
        await box.write_text("written.txt", "by the host\n")
        await box.write_text("/app/deep/er.txt", "deeper\n")
        _, out, _ = await sh(box, "cat /app/written.txt /app/deep/er.txt /app/made-by-command.txt")
        assert out == "by the host\ndeeper\nmine\n"
        assert await box.read_text("/app/given.txt") == "given by the image\n"
        entries, cut = await box.list_files("/app", max_entries=100)
        assert {e.path for e in entries} >= {"given.txt", "sub/nested.txt", "written.txt", "deep/er.txt"} and not cut
        await box.remove("given.txt")
        assert (await sh(box, "test -e /app/given.txt"))[0] == 1
        with pytest.raises(SandboxFileError):
            await box.write_text("/workspace/x.txt", "not a root of this sandbox")
        if not _sized(docker_target):
            # The workdir is the disk budget (a tmpfs of it), the image's files copied onto it.
            assert await _size_of(box, "/app") == box.limits["disk"]
    finally:
        await box.close()


async def test_a_workdir_the_image_does_not_have(docker_target: Target) -> None:
    """On the suite's plain image (nothing at /srv/app), the workdir is made, empty and the sandbox user's."""
    box = await _create(docker_target, SandboxSpec(rollout_id="workdir-new", workdir="/srv/app"))
    try:
        code, out, _ = await sh(box, "pwd; ls -A; stat -c %u /srv/app; touch mine")
        assert code == 0 and out == "/srv/app\n1000\n"
    finally:
        await box.close()


async def test_image_content_over_the_budget_fails_the_create_and_leaves_nothing(
    docker_target: Target, layout_image: str, docker_engine: Any
) -> None:
    if _sized(docker_target):
        pytest.skip("the engine sizes the writable layer: the workdir is no tmpfs here")
    limits = dataclasses.replace(SandboxLimits.from_settings(docker_target.settings), disk_mb=1)
    spec = SandboxSpec(rollout_id="too-big", image=layout_image, workdir="/big", limits=limits)
    with pytest.raises(SandboxError, match="no space left"):
        await _create(docker_target, spec)
    # (`no_leftover_containers` then checks that neither the sandbox's container nor the copy's helper is left.)


def test_workdirs_on_the_sandboxes_own_directories_are_refused() -> None:
    for workdir in ("/home/sandbox/x", "/tmp", "/logs", "/", "/usr/app", "/a:b", "/tests", "relative"):
        with pytest.raises(SandboxUnsupportedError) as caught:
            SandboxLayout.of(SandboxSpec(rollout_id="x", workdir=workdir))
        assert caught.value.setting == "workdir", workdir
    with pytest.raises(SandboxUnsupportedError) as caught:
        SandboxLayout.of(SandboxSpec(rollout_id="x", workdir="/app", writable_roots=("/app/inner",)))
    assert caught.value.setting == "writable_roots"
    assert SandboxLayout.of(SandboxSpec(rollout_id="x")).paths == PATHS


# -- further writable roots, /tests ------------------------------------------------------------------------------


async def test_writable_roots_are_the_sandbox_users(docker_target: Target, layout_image: str) -> None:
    spec = SandboxSpec(rollout_id="roots", image=layout_image, workdir="/app", writable_roots=("/solution", "/queries"))
    box = await _create(docker_target, spec)
    try:
        code, out, err = await sh(box, "for d in /solution /queries; do stat -c %u:%a $d; touch $d/by-user; done; "
                                       "ls -A /solution; cat /queries/q.txt")
        assert (code, err) == (0, ""), err
        assert out.splitlines() == ["1000:755", "1000:755", "by-user", "from the image"]
        await box.write_text("/solution/solve.sh", "echo solved\n", mode=0o755)
        await box.mkdir("/queries/more/dirs")
        assert (await sh(box, "/solution/solve.sh; test -d /queries/more/dirs"))[1] == "solved\n"
        assert await box.read_text("/queries/q.txt") == "from the image\n"
        entries, _ = await box.list_files("/solution", max_entries=10)
        assert sorted(e.path for e in entries) == ["by-user", "solve.sh"]
        await box.remove("/solution/solve.sh")
        assert (await sh(box, "test -e /solution/solve.sh"))[0] == 1
        for outside in ("/elsewhere/x.txt", "/solutions/x.txt"):
            with pytest.raises(SandboxFileError):
                await box.write_text(outside, "no")
        if not _sized(docker_target):
            assert await _size_of(box, "/solution") == box.limits["disk"]
    finally:
        await box.close()


async def test_tests_only_with_spec_tests(docker_target: Target) -> None:
    """The local backend's check (tests/backends/test_task_layout.py), on Docker, where the standard layout stays
    as it was for a sandbox without hidden tests."""
    from tests.backends.test_task_layout import test_tests_only_with_spec_tests as on

    plain = await _create(docker_target, SandboxSpec(rollout_id="layout"))
    try:
        assert plain.paths == PATHS
    finally:
        await plain.close()
    await on(docker_target)


# -- users -------------------------------------------------------------------------------------------------------

_CAP_SETUID = 1 << 7
_CAP_SYS_CHROOT = 1 << 18
"""Not one the launcher needs: given to root's commands only with `SandboxSpec.users` (a default container's)."""


def _cap_eff(status: str) -> int:
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("CapEff:")), 16)


async def test_users_root_and_others(docker_target: Target, layout_image: str) -> None:
    box = await _create(docker_target, SandboxSpec(rollout_id="users", image=layout_image, workdir="/app", users=True))
    try:
        code, out, _ = await sh(box, "id -u; id -g; cat /proc/self/status", user="root")
        uid, gid, status = out.split("\n", 2)
        assert (code, uid, gid) == (0, "0", "0")
        assert _cap_eff(status) & _CAP_SETUID and _cap_eff(status) & _CAP_SYS_CHROOT
        # Root may become another user: by setpriv, and by Python's own setuid.
        code, out, err = await sh(box, "setpriv --reuid=65534 --regid=65534 --clear-groups id -u; "
                                       "python3 -c 'import os; os.setgroups([]); os.setgid(65534); os.setuid(65534); "
                                       "print(os.getuid()); open(\"/app/given.txt\", \"a\")' ; echo $?",
                                  user="root")
        assert out.splitlines()[:2] == ["65534", "65534"], (out, err)
        assert out.splitlines()[-1] != "0" and "Permission denied" in err  # nobody cannot write root's file
        assert (await sh(box, "echo root > /app/given.txt", user="root"))[0] == 0
        for user, expected in (("nobody", "65534 65534"), ("65534", "65534 65534"), ("777", "777 777"),
                               ("app", "1234 1234")):
            code, out, err = await sh(box, 'echo "$(id -u) $(id -g)"; grep ^CapEff: /proc/self/status', user=user)
            lines = out.splitlines()
            assert (code, lines[0]) == (0, expected), (user, out, err)
            assert _cap_eff(lines[1]) == 0, user
        assert "4321" in (await sh(box, "id -G", user="app"))[1].split()  # its supplementary group
        code, out, _ = await sh(box, 'id -u; grep ^CapEff: /proc/self/status')
        assert code == 0 and out.splitlines()[0] == "1000" and _cap_eff(out.splitlines()[1]) == 0
        code, _, err = await sh(box, "echo should not run", user="no-such-user")
        assert code == 127 and "no user 'no-such-user'" in err
        # spawn as root too
        process = await box.spawn([box.shell, "-c", "id -u > /tmp/spawned-as"], user="root")
        assert await process.wait() == 0
        assert await box.read_text("/tmp/spawned-as") == "0\n"
        # A fresh context (verify's) is the named user's.
        assert (await sh(box, 'stat -c %u "$HOME"', user="app", fresh=True))[1] == "1234\n"
    finally:
        await box.close()


async def test_a_user_without_spec_users_is_refused(docker_target: Target, docker_engine: Any) -> None:
    box = await _create(docker_target, SandboxSpec(rollout_id="no-users"))
    try:
        for call in (lambda: sh(box, "touch /tmp/ran", user="root"),
                     lambda: box.spawn([box.shell, "-c", "touch /tmp/ran"], user="root")):
            with pytest.raises(SandboxUnsupportedError) as caught:
                await call()
            assert caught.value.setting == "users" and caught.value.backend == "docker"
        assert (await sh(box, "test -e /tmp/ran"))[0] == 1  # nothing ran
        caps = docker_engine.api.inspect_container(box.id)["HostConfig"]["CapAdd"]
        assert sorted(caps) == sorted(["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_KILL", "CAP_SETUID",
                                       "CAP_SETGID"]) or sorted(caps) == sorted(
            ["CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETUID", "SETGID"])
    finally:
        await box.close()


# -- the remote backends refuse --------------------------------------------------------------------------------


_REFUSED = [
    ("workdir", {"workdir": "/app"}),
    ("writable_roots", {"writable_roots": ("/solution",)}),
    ("tests", {"tests": True}),
    ("users", {"users": True}),
]


@pytest.fixture
def e2b_created() -> Iterator[list[dict[str, Any]]]:
    FakeAsyncSandbox.created.clear()
    yield FakeAsyncSandbox.created
    FakeAsyncSandbox.created.clear()


@pytest.mark.parametrize("remote", ["hf", "e2b-fake"])
@pytest.mark.parametrize(("setting", "fields"), _REFUSED, ids=[s for s, _ in _REFUSED])
async def test_remote_backends_refuse_what_they_cannot_honour(
    remote: str, setting: str, fields: dict[str, Any], backend_for: Callable[..., Target], settings: Settings,
    e2b_created: list[dict[str, Any]],
) -> None:
    target = backend_for(remote)
    before = sorted(Path(settings.state_dir).iterdir()) if Path(settings.state_dir).exists() else []
    with pytest.raises(SandboxUnsupportedError) as caught:
        await target.backends.get(target.name).create(SandboxSpec(rollout_id="refused", **fields))
    assert caught.value.setting == setting and caught.value.backend == target.name
    assert setting in str(caught.value)
    after = sorted(Path(settings.state_dir).iterdir()) if Path(settings.state_dir).exists() else []
    assert after == before and e2b_created == []  # nothing was made


async def test_remote_exec_as_another_user_is_refused(backend_for: Callable[..., Target]) -> None:
    target = backend_for("hf")
    box = await target.backends.get("hf").create(SandboxSpec(rollout_id="hf-user"))
    try:
        with pytest.raises(SandboxUnsupportedError) as caught:
            await sh(box, "true", user="root")
        assert caught.value.setting == "users"
        assert (await sh(box, "echo fine"))[1] == "fine\n"
    finally:
        await box.close()

