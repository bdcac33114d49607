"""The sandbox a task declares (`SandboxSpec.workdir`, `writable_roots`, `tests`, `users`), run against the
backends that honour it: its workdir where it says (`/app`), further writable roots (`/solution`, `/queries`),
`/tests` only when asked, and other users (`exec(user=...)`: root of the sandbox's own user namespace, never
the host's, able to become `nobody`); and the unisolated local mode refusing what it cannot show, naming it.

Parametrised over `KINDS` (see tests/backends/conftest.py `backend_for`); checks of the local backend's host
side (where files land on the host, host ids) run for it only. Docker's own cases are in test_docker_layout.py.
"""

from __future__ import annotations

import os
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from coding_agent_env.errors import SandboxFileError, SandboxUnsupportedError
from coding_agent_env.sandbox import Backends, Sandbox, SandboxSpec
from coding_agent_env.sandbox.local import uids
from coding_agent_env.sandbox.local.sandbox import LocalSandbox
from coding_agent_env.settings import LocalConfig, Settings
from tests.backends.conftest import Target
from tests.helpers import wait_until

OUT = 64 * 1024
KINDS = ["local"]
"""Backend kinds under test (conftest `backend_for`); a kind is added here once its backend honours the spec."""
AS_ROOT = os.geteuid() == 0
_CAP_SETUID = 1 << 7
_CAP_SYS_CHROOT = 1 << 18
_CAP_SYS_ADMIN = 1 << 21


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def target(kind: str, backend_for: Callable[..., Target], assert_no_leftovers: None,
           no_range_processes: None) -> Target:
    return backend_for(kind)


@pytest.fixture
def no_range_processes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fails the test if a process of an id range one of its sandboxes held (their users: root, nobody) outlives
    the test (waiting a little for ones still exiting)."""
    taken: list[int] = []
    take = uids.UidPool.take

    def recorded(pool: uids.UidPool) -> int:
        first = take(pool)
        if pool._prefix:  # a range pool
            taken.append(first)
        return first

    monkeypatch.setattr(uids.UidPool, "take", recorded)
    yield

    def left() -> list[str]:
        found = []
        for entry in Path("/proc").iterdir():
            try:
                if not entry.name.isdigit():
                    continue
                owner = entry.stat().st_uid
                if not any(base <= owner < base + 65536 for base in taken):
                    continue
                state = (entry / "stat").read_text().rpartition(")")[2].split()[:1]
                if state != ["Z"]:  # a zombie is dead already, waiting for its parent
                    found.append(f"{entry.name} {state}: {(entry / 'cmdline').read_bytes()[:200]!r}")
            except OSError:
                pass  # gone meanwhile
        return found

    wait_until(lambda: not left(), lambda: f"processes of a sandbox's id range left: {left()}", timeout_s=5)


async def _create(target: Target, spec: SandboxSpec) -> Sandbox:
    return await target.backends.get(target.name).create(spec)


async def sh(box: Sandbox, script: str, **kw: Any) -> tuple[int | None, str, str]:
    done = await box.exec([box.shell, "-c", script], timeout=30, max_output_bytes=OUT, **kw)
    return done.exit_code, done.stdout.decode(), done.stderr.decode()


def _cap_eff(status: str) -> int:
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("CapEff:")), 16)


def _uid_map(text: str) -> list[tuple[int, int, int]]:
    return [(int(a), int(b), int(c)) for a, b, c in (line.split() for line in text.splitlines())]


# -- the workdir -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("workdir", ["/app", "/srv/app"])
async def test_the_workdir_is_where_the_spec_says(target: Target, workdir: str) -> None:
    box = await _create(target, SandboxSpec(rollout_id="workdir", workdir=workdir))
    try:
        assert box.paths.workdir == workdir
        await box.write_text("written.txt", "by the host\n")
        await box.write_text(f"{workdir}/deep/er.txt", "deeper\n")
        code, out, err = await sh(box, f"pwd; cat {workdir}/written.txt deep/er.txt; echo mine > made.txt; "
                                       "test ! -e /workspace && echo no-workspace")
        assert (code, err) == (0, ""), err
        assert out.splitlines() == [workdir, "by the host", "deeper", "no-workspace"]
        assert await box.read_text(f"{workdir}/made.txt") == "mine\n"
        assert await box.read_text("made.txt") == "mine\n"
        await box.mkdir("sub/dir")
        assert (await sh(box, "pwd", cwd=f"{workdir}/sub/dir"))[1] == f"{workdir}/sub/dir\n"
        entries, cut = await box.list_files(workdir, max_entries=100)
        assert {e.path for e in entries} >= {"written.txt", "deep/er.txt", "made.txt", "sub/dir"} and not cut
        await box.remove("written.txt")
        assert (await sh(box, f"test -e {workdir}/written.txt"))[0] == 1
        with pytest.raises(SandboxFileError):
            await box.write_text("/workspace/x.txt", "not a root of this sandbox")
        # A fresh context (verify's) starts there too.
        assert (await sh(box, "pwd", fresh=True))[1] == f"{workdir}\n"
        if isinstance(box, LocalSandbox):  # the workspace's host directory, under the sandbox's root
            host = box.host_path(f"{workdir}/made.txt")
            assert host.read_text() == "mine\n" and host.parent.name == "work"
    finally:
        await box.close()


@pytest.mark.parametrize("workdir", ["/home/sandbox/x", "/tmp", "/logs", "/", "/usr/app", "/tests", "/run/x",
                                     "/opt/agents", "relative", "/proc/x"])
async def test_workdirs_on_the_sandboxes_own_directories_are_refused(target: Target, workdir: str,
                                                                   settings: Settings) -> None:
    with pytest.raises(SandboxUnsupportedError) as caught:
        await _create(target, SandboxSpec(rollout_id="refused", workdir=workdir))
    assert (caught.value.setting, caught.value.backend) == ("workdir", target.name)
    assert not list(settings.state_dir.glob("*-refused-*"))  # nothing made


async def test_writable_roots_overlapping_the_workdir_or_the_system_are_refused(target: Target) -> None:
    for roots in (("/app/inner",), ("/app",), ("/solution", "/solution/x"), ("/etc/x",), ("/logs",)):
        with pytest.raises(SandboxUnsupportedError) as caught:
            await _create(target, SandboxSpec(rollout_id="refused", workdir="/app", writable_roots=roots))
        assert caught.value.setting == "writable_roots", roots


# -- further writable roots, /tests ------------------------------------------------------------------------------


async def test_writable_roots_are_the_sandbox_users(target: Target) -> None:
    spec = SandboxSpec(rollout_id="roots", workdir="/app", writable_roots=("/solution", "/queries"))
    box = await _create(target, spec)
    try:
        code, out, err = await sh(box, "for d in /solution /queries; do stat -c %u:%a $d; touch $d/by-user; done; "
                                       "ls -A /solution /queries")
        assert (code, err) == (0, ""), err
        assert out.splitlines() == ["1000:755", "1000:755", "/queries:", "by-user", "", "/solution:", "by-user"]
        await box.write_text("/solution/solve.sh", "echo solved\n", mode=0o755)
        await box.mkdir("/queries/more/dirs")
        await box.write_text("/queries/more/q.txt", "a query\n")
        assert (await sh(box, "/solution/solve.sh; test -d /queries/more/dirs && cat /queries/more/q.txt"))[1] == \
            "solved\na query\n"
        assert await box.read_text("/queries/by-user") == ""
        entries, _ = await box.list_files("/solution", max_entries=10)
        assert sorted(e.path for e in entries) == ["by-user", "solve.sh"]
        await box.remove("/solution/solve.sh")
        assert (await sh(box, "test -e /solution/solve.sh"))[0] == 1
        for outside in ("/elsewhere/x.txt", "/solutions/x.txt", "/queries/../etc/x"):
            with pytest.raises(SandboxFileError):
                await box.write_text(outside, "no")
        if isinstance(box, LocalSandbox):
            # Each root is a directory of its own under the sandbox's root: inside its disk budget.
            root = box.host_path("/app").parent
            hosts = {box.host_path(path).parent for path in ("/solution/by-user", "/queries/by-user")}
            assert len(hosts) == 2 and all(host.parent == root for host in hosts)
            assert all(host.stat().st_uid == (box.host_uid if box.host_uid is not None else os.geteuid())
                       for host in hosts)
            if box._tmpfs:
                _, out, _ = await sh(box, "python3 -c \"import os; s = os.statvfs('/solution'); "
                                          "print(s.f_blocks * s.f_frsize)\"")
                assert int(out) == box.limits["disk"]
    finally:
        await box.close()


async def test_tests_only_with_spec_tests(target: Target) -> None:
    plain = await _create(target, SandboxSpec(rollout_id="no-tests"))
    try:
        assert plain.paths.tests is None
        assert (await sh(plain, "test -e /tests || test -L /tests"))[0] == 1
    finally:
        await plain.close()
    shown = await _create(target, SandboxSpec(rollout_id="tests", tests=True))
    try:
        assert shown.paths.tests == "/tests"
        await shown.write_text(f"{shown.paths.logs}/tests/test.sh", "echo hidden test\n")
        code, out, _ = await sh(shown, "readlink /tests; bash /tests/test.sh")
        assert (code, out) == (0, f"{shown.paths.logs}/tests\nhidden test\n")
    finally:
        await shown.close()


# -- users ---------------------------------------------------------------------------------------------------------


def _needs_root() -> None:
    if not AS_ROOT:
        pytest.skip("a sandbox with users needs a root server (its own range of host ids)")


async def test_users_root_the_default_user_and_others(target: Target) -> None:
    _needs_root()
    box = await _create(target, SandboxSpec(rollout_id="users", workdir="/app", users=True))
    try:
        code, out, _ = await sh(box, "id -u; id -g; cat /proc/self/status", user="root")
        uid, gid, status = out.split("\n", 2)
        assert (code, uid, gid) == (0, "0", "0")
        caps = _cap_eff(status)
        assert caps & _CAP_SETUID and caps & _CAP_SYS_CHROOT and not caps & _CAP_SYS_ADMIN  # no mounts
        code, out, _ = await sh(box, "id -u; grep ^CapEff: /proc/self/status")
        assert code == 0 and out.splitlines()[0] == "1000" and _cap_eff(out.splitlines()[1]) == 0
        for user in ("root", None):  # no command holds a descriptor of the namespace (it could keep it alive)
            code, out, _ = await sh(box, "ls -l /proc/self/fd/", user=user)
            assert code == 0 and "pipe:" in out and "user:[" not in out, out
        for user, expected in (("nobody", "65534 65534"), ("65534", "65534 65534"), ("777", "777 777"),
                               ("0", "0 0")):
            code, out, err = await sh(box, 'echo "$(id -u) $(id -g)"; grep ^CapEff: /proc/self/status', user=user)
            lines = out.splitlines()
            assert (code, lines[0]) == (0, expected), (user, out, err)
            assert (_cap_eff(lines[1]) == 0) == (user != "0"), user
        code, out, err = await sh(box, "echo should not run", user="no-such-user")
        assert (code, out) == (127, "") and "no user 'no-such-user'" in err
        code, out, err = await sh(box, "echo should not run", user="70000")
        assert (code, out) == (127, "") and "not mapped" in err
        process = await box.spawn([box.shell, "-c", "id -u > /tmp/spawned-as"], user="root")
        assert await process.wait() == 0
        assert await box.read_text("/tmp/spawned-as") == "0\n"
        # The fresh context (verify's) is the named user's; /tmp is shared by every user (sticky).
        assert (await sh(box, 'stat -c %u "$HOME" "$TMPDIR"; touch "$TMPDIR/x"', user="nobody", fresh=True))[1] \
            == "65534\n65534\n"
        code, out, err = await sh(box, "stat -c %a /tmp; touch /tmp/by-nobody && echo ok", user="nobody")
        assert (code, out) == (0, "1777\nok\n"), err
        # What root and nobody make in the workspace is theirs inside; the sandbox's own user's files stay its own.
        code, _, err = await sh(box, "touch by-root; chown 65534:65534 by-root; touch by-root-kept; "
                                     "echo root > by-user.txt", user="root")
        assert code == 0, err
        assert (await sh(box, "stat -c %u:%g by-root by-root-kept"))[1] == "65534:65534\n0:0\n"
        await box.write_text("by-host.txt", "from the host\n")
        assert (await sh(box, "stat -c %u by-host.txt; echo more >> by-host.txt"))[:2] == (0, "1000\n")
    finally:
        await box.close()


async def test_root_can_become_nobody(target: Target) -> None:
    _needs_root()
    box = await _create(target, SandboxSpec(rollout_id="setuid", users=True))
    try:
        await box.write_text("mine.txt", "the sandbox user's\n", mode=0o644)
        code, out, err = await sh(
            box,
            "setpriv --reuid=65534 --regid=65534 --clear-groups id -u; "
            "python3 -c 'import os; os.setgroups([]); os.setgid(65534); os.setuid(65534); print(os.getuid()); "
            "open(\"mine.txt\", \"a\")'; echo $?",
            user="root",
        )
        lines = out.splitlines()
        assert lines[:2] == ["65534", "65534"], (out, err)
        assert lines[-1] != "0" and "Permission denied" in err  # nobody cannot write the sandbox user's file
        # The sandbox's own user cannot become anyone.
        code, _, err = await sh(box, "setpriv --reuid=65534 --regid=65534 --clear-groups id -u")
        assert code != 0 and "Operation not permitted" in err
    finally:
        await box.close()


@pytest.fixture
def host_secret() -> Iterator[Path]:
    """A directory of host root's (0755) holding a 0600 file of host root's."""
    directory = Path(tempfile.mkdtemp(prefix="cae-host-secret-"))
    os.chmod(directory, 0o755)
    secret = directory / "secret"
    secret.write_text("host root's secret\n")
    os.chmod(secret, 0o600)
    try:
        yield directory
    finally:
        for entry in directory.iterdir():
            entry.unlink()
        directory.rmdir()


async def test_inner_root_has_no_host_privilege(target: Target, host_secret: Path) -> None:
    _needs_root()
    spec = SandboxSpec(rollout_id="no-host", users=True, agents_dir=str(host_secret))
    box = await _create(target, spec)
    try:
        agents = box.agents_dir
        assert agents is not None
        script = (f"ls {agents}; cat {agents}/secret; echo read=$?; touch {agents}/planted; echo plant=$?; "
                  f"chmod 644 {agents}/secret; echo chmod=$?; touch /usr/planted /etc/planted; echo usr=$?; "
                  "head -c1 /etc/shadow; echo shadow=$?; touch in-workdir; echo own=$?")
        code, out, err = await sh(box, script, user="root")
        assert "secret" in out and "host root's secret" not in out, out
        for result in ("read", "plant", "chmod", "usr", "shadow"):
            assert f"{result}=0" not in out, (result, out, err)
        assert "own=0" in out
        assert sorted(p.name for p in host_secret.iterdir()) == ["secret"]
        assert stat.S_IMODE(os.stat(host_secret / "secret").st_mode) == 0o600
        assert not Path("/usr/planted").exists() and not Path("/etc/planted").exists()
        if isinstance(box, LocalSandbox):
            made = box.host_path(f"{box.paths.workdir}/in-workdir").stat()
            pool = range(box.host_uid or 0, (box.host_uid or 0) + 1)
            assert made.st_uid != 0 and made.st_gid != 0 and made.st_uid not in pool
    finally:
        await box.close()


async def test_two_sandboxes_get_disjoint_ranges_given_back_at_close(target: Target) -> None:
    _needs_root()
    boxes = [await _create(target, SandboxSpec(rollout_id=f"range{i}", users=True)) for i in range(2)]
    closed = False
    try:
        maps = []
        for box in boxes:
            code, out, _ = await sh(box, "cat /proc/self/uid_map")
            assert code == 0
            maps.append(_uid_map(out))
            gid_out = (await sh(box, "cat /proc/self/gid_map"))[1]
            assert _uid_map(gid_out) == maps[-1]
        hosts = []
        for box, mapping in zip(boxes, maps):
            assert sum(count for _, _, count in mapping) == 65536  # inner 0..65535
            assert sorted(inner for inner, _, _ in mapping)[0] == 0
            own = [host for inner, host, count in mapping if inner <= 1000 < inner + count]
            assert own == [box.host_uid]  # the sandbox's own user is its uid, as without users
            ids = {host + i for inner, host, count in mapping for i in range(count) if host != box.host_uid}
            assert 0 not in ids
            hosts.append(ids)
        assert not hosts[0] & hosts[1], "two live sandboxes share host ids"
        bases = [min(ids) for ids in hosts]
        assert all((uids.LOCK_DIR / f"range-{base}.lock").exists() for base in bases)
        for box in boxes:
            await box.close()
        closed = True
        assert not any((uids.LOCK_DIR / f"range-{base}.lock").exists() for base in bases)
    finally:
        if not closed:
            for box in boxes:
                await box.close()


async def test_a_user_without_spec_users_is_refused(target: Target) -> None:
    box = await _create(target, SandboxSpec(rollout_id="no-users"))
    try:
        for call in (lambda: sh(box, "touch /tmp/ran", user="root"),
                     lambda: box.spawn([box.shell, "-c", "touch /tmp/ran"], user="root")):
            with pytest.raises(SandboxUnsupportedError) as caught:
                await call()
            assert (caught.value.setting, caught.value.backend) == ("users", target.name)
        assert (await sh(box, "test -e /tmp/ran"))[0] == 1  # nothing ran
    finally:
        await box.close()


async def test_users_need_a_root_server(target: Target, monkeypatch: pytest.MonkeyPatch, settings: Settings) -> None:
    """Without root there is no range of host ids to map: refused at create, nothing made."""
    backend = target.backends.get(target.name)
    if target.name != "local":
        pytest.skip("the local backend's own mode")
    monkeypatch.setattr(backend, "_as_root", False)
    with pytest.raises(SandboxUnsupportedError) as caught:
        await backend.create(SandboxSpec(rollout_id="refused", users=True))
    assert caught.value.setting == "users" and "root" in str(caught.value)
    assert not list(settings.state_dir.glob("*-refused-*"))


async def test_a_user_namespace_that_cannot_be_made_refuses_the_sandbox(
    target: Target, monkeypatch: pytest.MonkeyPatch, settings: Settings
) -> None:
    """No `unshare` here (say): refused naming users, its uid and id range given back, nothing made."""
    _needs_root()
    from coding_agent_env.sandbox.local import layout

    def no_unshare(*args: Any, **kwargs: Any) -> Any:
        raise FileNotFoundError(2, "No such file or directory", "unshare")

    # Only the namespace's maker finds no unshare (the probe and bwrap keep the real `subprocess`).
    monkeypatch.setattr(layout, "subprocess", SimpleNamespace(Popen=no_unshare, PIPE=subprocess.PIPE,
                                                              TimeoutExpired=subprocess.TimeoutExpired))
    held = dict(uids.UidPool._held)
    with pytest.raises(SandboxUnsupportedError) as caught:
        await _create(target, SandboxSpec(rollout_id="refused", users=True))
    assert caught.value.setting == "users" and "unshare" in str(caught.value)
    assert uids.UidPool._held == held  # the uid and the range are free again
    assert not list(settings.state_dir.glob("*-refused-*"))


async def test_users_through_nsenter(settings: Settings, assert_no_leftovers: None, no_range_processes: None) -> None:
    """The same users where the root launcher is nsenter (no C compiler)."""
    _needs_root()
    local = settings.backend_config("local")
    assert isinstance(local, LocalConfig)
    backends = Backends(settings.with_backends(local.model_copy(update={"root_launcher": "nsenter"})))
    try:
        box = await backends.get("local").create(SandboxSpec(rollout_id="nsenter", users=True, workdir="/app"))
        try:
            assert "compiled" not in backends.get("local").check().detail
            assert (await sh(box, "id -u; pwd", user="root"))[1] == "0\n/app\n"
            assert (await sh(box, "setpriv --reuid=65534 --regid=65534 --clear-groups id -u", user="root"))[1] \
                == "65534\n"
            assert (await sh(box, "id -u; ls /proc/self/fd"))[1] == "1000\n0\n1\n2\n3\n"  # 3: ls's own
        finally:
            await box.close()
    finally:
        await backends.aclose()


async def test_users_through_plain_bubblewrap(target: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same users where root starts bwrap itself (no root launcher usable): the namespace passed to it."""
    _needs_root()
    from coding_agent_env.sandbox.local.launch import Bwrap
    from coding_agent_env.sandbox.local.probe import system_args

    backend = target.backends.get(target.name)
    if target.name != "local":
        pytest.skip("the local backend's own mode")
    launch = backend._probe()  # type: ignore[attr-defined]
    assert isinstance(launch, Bwrap)
    monkeypatch.setattr(backend, "_launch", Bwrap("plain", launch.bwrap, system_args()))
    box = await backend.create(SandboxSpec(rollout_id="plain", users=True, workdir="/app"))
    try:
        for user, expected in (("root", "0"), (None, "1000"), ("nobody", "65534")):
            code, out, err = await sh(box, "id -u; pwd; ls -l /proc/self/fd/", user=user)
            assert code == 0 and out.splitlines()[:2] == [expected, "/app"], (user, out, err)
            assert "user:[" not in out
    finally:
        await box.close()


# -- what the unisolated mode cannot show ------------------------------------------------------------------------


_REFUSED = [
    ("workdir", {"workdir": "/app"}),
    ("tests", {"tests": True, "workdir": "/workspace"}),
    ("writable_roots", {"writable_roots": ("/solution",)}),
    ("users", {"users": True}),
]


@pytest.mark.parametrize(("setting", "fields"), _REFUSED, ids=[s for s, _ in _REFUSED])
async def test_unisolated_refuses_what_it_cannot_show(
    setting: str, fields: dict[str, Any], backend_for: Callable[..., Target], settings: Settings,
    assert_no_leftovers: None,
) -> None:
    target = backend_for("local-unisolated")
    with pytest.raises(SandboxUnsupportedError) as caught:
        await _create(target, SandboxSpec(rollout_id="refused", **fields))
    assert (caught.value.setting, caught.value.backend) == (setting, "local")
    assert setting in str(caught.value)
    assert not list(settings.state_dir.glob("*-refused-*"))


async def test_unisolated_shows_no_tests(backend_for: Callable[..., Target], assert_no_leftovers: None) -> None:
    box = await _create(backend_for("local-unisolated"), SandboxSpec(rollout_id="unisolated"))
    try:
        assert box.isolation == "none" and box.paths.tests is None
    finally:
        await box.close()


def test_a_bubblewrap_without_userns_is_named(tmp_path: Path) -> None:
    """An old bubblewrap (before 0.7: no `--userns`) is what a sandbox with users is refused for."""
    from coding_agent_env.sandbox.local.launch import Bwrap

    old = tmp_path / "bwrap"
    old.write_text("#!/bin/sh\necho '    --unshare-user  Create new user namespace'\necho '    --block-fd FD  Block'\n")
    old.chmod(0o755)
    refusal = Bwrap("test", str(old), ()).users_refusal()
    assert refusal is not None and "--userns" in refusal and "--block-fd" not in refusal


def test_a_sandbox_without_users_starts_as_before() -> None:
    """Without `SandboxSpec.users` bwrap makes its own user namespace with the sandbox user alone, as it did."""
    from coding_agent_env.sandbox.local.launch import namespace_args

    assert namespace_args(share_net=False) == [
        "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--unshare-user", "--uid", "1000",
        "--gid", "1000"]
    assert namespace_args(share_net=True)[-1] == "--share-net"
    joined = namespace_args(share_net=True, userns=7)
    assert "--unshare-all" not in joined and "--unshare-net" not in joined
    assert joined[joined.index("--userns") + 1] == joined[joined.index("--block-fd") + 1] == "7"
