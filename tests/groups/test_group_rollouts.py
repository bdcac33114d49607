"""Groups of rollouts that share one setup (`group_id`) on the local backend: members start from the set-up
state, are as isolated from each other as independent sandboxes, score independently; a failed setup fails the
group once; a member's crash, the template's expiry and a server killed mid-group leave nothing behind."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from coding_agent_env.models import RolloutRequest, RolloutStatus
from coding_agent_env.rollout import run_rollout
from coding_agent_env.sandbox import Backends
from coding_agent_env.sandbox.base import Sandbox, SandboxSpec
from coding_agent_env.sandbox.local import backend as local_backend
from coding_agent_env.settings import Settings
from tests.helpers import leftovers, poll, sandbox_processes, wait_until

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="forking local sandboxes needs a root server")

SETUP = ("mkdir -p pkg/sub && for i in $(seq 200); do echo $i > pkg/sub/$i; done && "
         "head -c 5000000 /dev/urandom > blob && echo $RANDOM$RANDOM$RANDOM > stamp && echo home > ~/set-up")


def member(index: int, solution: list[str], **fields: object) -> RolloutRequest:
    task: dict[str, object] = {
        "instruction": "start from the group's state", "agent": "oracle", "group_id": "g", "setup": [SETUP],
        "solution": [f"touch mine-{index}", *solution],
        "verify": ["test -f pkg/sub/1", "test $(ls mine-* | wc -l) = 1"],
    }
    return RolloutRequest.model_validate({**task, **fields})


async def exists(sandbox: Sandbox, name: str) -> bool:
    entries, _ = await sandbox.list_files(".", max_entries=1000)
    return any(entry.path.rstrip("/").rsplit("/", 1)[-1] == name for entry in entries)


@pytest.fixture
def group_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"group_idle_s": 0.2})


@pytest.fixture
def no_leftovers(group_settings: Settings) -> Iterator[None]:
    yield
    wait_until(lambda: not leftovers(group_settings), lambda: f"left behind: {leftovers(group_settings)}")


async def test_members_start_from_the_set_up_state_and_score_independently(
    group_settings: Settings, no_leftovers: None
) -> None:
    async with Backends(group_settings) as backends:
        requests = [member(i, ["cat stamp > seen", "cat ~/set-up >> seen"]) for i in range(3)]
        requests.append(member(3, ["rm pkg/sub/1"]))  # this member breaks what verify needs: it alone scores less
        results = await asyncio.gather(*(run_rollout(r, backends=backends) for r in requests))
        assert [r.status for r in results] == [RolloutStatus.COMPLETED] * 4, [r.error for r in results]
        assert [r.reward for r in results] == [1.0, 1.0, 1.0, 0.5]
        groups = [r.group for r in results]
        assert all(g is not None and g.setup == "forked" and g.group_id == "g" for g in groups)
        assert len({g.template for g in groups if g}) == 1 and sum(g.made_here for g in groups if g) == 1
        # One setup: every member saw the same random stamp, written once, and its setup results are its.
        seen = {r.files.get("seen") for r in results[:3]}
        assert len(seen) == 1 and seen.pop().split("\n")[1] == "home"
        assert len({r.setup_results[0].stdout for r in results}) == 1 and results[0].setup_results[0].exit_code == 0
        assert all(r.timings.setup_s < 1.0 for r in results)
        await poll(lambda: len(backends.templates) == 0, "the template to expire after the last member")
        await backends.templates.drain()


async def test_a_snapshot_cancelled_while_its_template_is_measured_leaves_nothing(
    group_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The template's bytes are measured in a worker thread once the sandbox is frozen (under a busy pool, for as
    long as the pool stays busy); a snapshot cancelled then must release the template it made (its tmpfs root, its
    uid), which nobody else holds. The measurement is held by a stand-in for `fork.used_bytes` (public: the function
    the backend calls) until the snapshot is cancelled."""
    measuring, go_on = threading.Event(), threading.Event()

    def held(root: Path) -> int:
        measuring.set()
        go_on.wait(10)
        return 0

    monkeypatch.setattr(local_backend, "used_bytes", held)
    async with Backends(group_settings) as backends:
        local = backends.get("local")
        origin = await local.create(SandboxSpec(rollout_id="template"))
        snapping = asyncio.ensure_future(local.snapshot(origin))
        try:
            await poll(measuring.is_set, "the template to be measured")
            snapping.cancel()
        finally:
            go_on.set()
        with pytest.raises(asyncio.CancelledError):
            await snapping
        # Before the backends close (whose teardown would sweep it): the template is gone already.
        await poll(lambda: not leftovers(group_settings), lambda: f"left behind: {leftovers(group_settings)}")


async def test_members_cannot_see_each_others_writes_or_processes(group_settings: Settings,
                                                                  no_leftovers: None) -> None:
    async with Backends(group_settings) as backends:
        local = backends.get("local")
        spec = SandboxSpec(rollout_id="template")
        assert local.fork_refusal(spec) is None
        origin = await local.create(spec)
        await origin.write_text("shared.txt", "set up")
        template = await local.snapshot(origin)
        assert origin.closed
        a = await local.fork(SandboxSpec(rollout_id="a"), template)
        b = await local.fork(SandboxSpec(rollout_id="b"), template)
        try:
            run = dict(timeout=20, max_output_bytes=65536)
            assert (await a.read_text("shared.txt")) == "set up" == (await b.read_text("shared.txt"))
            await a.write_text("shared.txt", "a's")
            await a.write_text("a-only.txt", "a")
            assert await b.read_text("shared.txt") == "set up"
            assert not await exists(b, "a-only.txt")
            sleeper = await a.spawn(["sleep", "300"], log_path="/tmp/sleep.log")
            # Members run as one host uid: only their own pid namespaces keep them apart. Everything b may
            # signal, it kills; a's process lives on, and b sees none of a's.
            def sleeping() -> list[str]:
                return [p for p in sandbox_processes(group_settings) if p.endswith(": sleep 300 ")]

            before = wait_until(sleeping, "a's sleep on the host")
            seen = await b.exec(["sh", "-c", "kill -9 -1; ls /proc | grep -c '^[0-9]'"], **run)
            assert int(seen.stdout.decode().split()[-1]) <= 4, seen  # its init, sh, ls, grep
            assert sleeping() == before and sleeper.returncode is None
            assert (await a.exec(["sh", "-c", "echo alive"], **run)).stdout == b"alive\n"
            # A fork made after both wrote starts from the template, not from either of them.
            c = await local.fork(SandboxSpec(rollout_id="c"), template)
            try:
                assert await c.read_text("shared.txt") == "set up" and not await exists(c, "a-only.txt")
            finally:
                await c.close()
            await sleeper.kill()
        finally:
            await a.close()
            await b.close()
            await template.release()
        with pytest.raises(Exception, match="released"):
            await local.fork(SandboxSpec(rollout_id="d"), template)


async def test_a_failed_setup_fails_every_member_once(group_settings: Settings, no_leftovers: None) -> None:
    async with Backends(group_settings) as backends:
        requests = [member(i, [], setup=["echo $RANDOM$RANDOM; exit 3"]) for i in range(3)]
        results = await asyncio.gather(*(run_rollout(r, backends=backends) for r in requests))
        assert {r.status for r in results} == {RolloutStatus.SETUP_FAILED}
        assert len({r.setup_results[0].stdout for r in results}) == 1  # ran once
        assert all(r.group and r.group.template is None and r.reward is None for r in results)
        assert sum(bool(r.group and r.group.made_here) for r in results) == 1


async def test_a_member_crash_leaves_the_others_untouched(group_settings: Settings, no_leftovers: None) -> None:
    async with Backends(group_settings) as backends:
        cancel = asyncio.Event()
        crashing = asyncio.ensure_future(run_rollout(member(0, ["sleep 300"]), backends=backends, cancel=cancel))
        await poll(lambda: len(backends.templates) == 1, "the group's template")
        others = [asyncio.ensure_future(run_rollout(member(i, []), backends=backends)) for i in (1, 2)]
        cancel.set()
        crashed = await crashing
        assert crashed.status is RolloutStatus.CANCELLED
        results = await asyncio.gather(*others)
        assert [r.reward for r in results] == [1.0, 1.0]
        assert all(r.group and r.group.setup == "forked" for r in results)


async def test_the_template_expires_and_a_later_member_sets_up_anew(group_settings: Settings,
                                                                     no_leftovers: None) -> None:
    async with Backends(group_settings) as backends:
        stamped = ["date +%s%N", SETUP]  # prints when it ran
        first = await run_rollout(member(0, [], setup=stamped), backends=backends)
        await poll(lambda: len(backends.templates) == 0, "the template to expire")
        await backends.templates.drain()
        later = await run_rollout(member(1, [], setup=stamped), backends=backends)
        assert first.group and later.group and first.group.made_here and later.group.made_here
        assert first.group.template != later.group.template
        assert first.setup_results[0].stdout != later.setup_results[0].stdout  # the setup ran again


async def test_members_of_other_tasks_never_share_a_template(group_settings: Settings, no_leftovers: None) -> None:
    async with Backends(group_settings) as backends:
        one = run_rollout(member(0, []), backends=backends)
        other = run_rollout(member(1, [], env={"VARIANT": "2"}), backends=backends)
        results = await asyncio.gather(one, other)
        assert all(r.group and r.group.made_here for r in results)
        assert results[0].group and results[1].group and results[0].group.template != results[1].group.template


async def test_what_cannot_fork_runs_its_setup_per_member(group_settings: Settings, no_leftovers: None) -> None:
    async with Backends(group_settings) as backends:
        users = await run_rollout(member(0, [], agent_user="root"), backends=backends)
        assert users.group and users.group.setup == "per_member" and "id range" in (users.group.note or "")
        assert users.reward == 1.0 and users.setup_results[0].exit_code == 0
        bare = await run_rollout(member(1, [], setup=[]), backends=backends)
        assert bare.group and bare.group.setup == "per_member" and bare.group.note == "the task has no setup to share"


_CRASHING_SERVER = textwrap.dedent("""
    import asyncio, sys
    from coding_agent_env.models import RolloutRequest
    from coding_agent_env.rollout import run_rollout
    from coding_agent_env.sandbox import Backends
    from coding_agent_env.settings import Settings

    async def main():
        async with Backends(Settings.from_env()) as backends:
            request = RolloutRequest(instruction="x", agent="oracle", group_id="g", setup=[sys.argv[1]],
                                     solution=["sleep 300"], verify=["true"])
            await asyncio.gather(*(run_rollout(request, backends=backends) for _ in range(3)))

    asyncio.run(main())
""")


async def test_a_server_killed_mid_group_leaves_nothing_after_its_restart(settings: Settings) -> None:
    local = settings.backends[0]
    env = {**os.environ, "STATE_DIR": str(settings.state_dir), "SANDBOX_BACKENDS": "local",
           "SANDBOX_UID_BASE": str(local.uid_base), "SANDBOX_UID_COUNT": str(local.uid_count)}  # type: ignore[union-attr]
    server = subprocess.Popen([sys.executable, "-c", _CRASHING_SERVER, SETUP], env=env, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        def sleeping_members() -> bool:
            roots = [p for p in Path(settings.state_dir).iterdir() if p.name.split("-", 1)[0] == str(server.pid)]
            assert server.poll() is None, server.stderr.read() if server.stderr else ""
            return len(roots) >= 4 and len(leftovers(settings).get("processes", [])) >= 3  # a template, 3 members

        await poll(sleeping_members, lambda: f"a group running: {leftovers(settings)}", timeout_s=60)
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        if server.stderr:
            server.stderr.close()
    assert leftovers(settings)  # the crash left the group's sandboxes, as a crash does
    async with Backends(settings) as restarted:
        assert await restarted.get("local").reap_orphans() >= 4
    await poll(lambda: not leftovers(settings), lambda: f"left behind: {leftovers(settings)}")
