"""An infrastructure fault is never the agent's failure (INTEGRITY 8): real bubblewrap, a root server's pool
uids, the oracle agent.

- A STATE_DIR under a private (0700) directory, as `mktemp -d` makes: the sandboxes' uids cannot reach their
  directories; the local backend refuses (at its probe: server start, naming the directory and the fix), so a
  rollout is refused before anything runs, never a scored 0. On main it was `agent_failed`, reward 0
  (`bwrap: Can't find source path ...: Permission denied`).
- A fault of bubblewrap's own setup after start (here: the operator makes the state dir's parent private while
  the server runs) is `SandboxStartError` (`infra_error`, reward null) with bwrap's message; on main the
  command "exited 1" and the rollout scored 0.
- A command that makes its own start fail (its agent made the workdir unreadable, so bwrap's `--chdir` fails)
  keeps its exit status: the agent cannot turn a 0 into an unscored rollout.

Root only: the pool uids are what cannot pass a private directory; a server that is not root runs its
sandboxes as its own user, who can.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from coding_agent_env.errors import BackendRefusedError, SandboxStartError
from coding_agent_env.models import RolloutRequest, RolloutStatus
from coding_agent_env.rollout import run_rollout
from coding_agent_env.sandbox import Backends
from coding_agent_env.sandbox.base import SandboxSpec
from coding_agent_env.settings import Settings
from coding_agent_env.settings.backends import LocalConfig

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the sandboxes' own uids exist only on a root server")

TASK = RolloutRequest(instruction="write f", task_id="plumbing", agent="oracle", solution=["echo ok > f"],
                      verify=["grep -qx ok f"])


@pytest.fixture
def parent() -> Iterator[Path]:
    """A private directory, as `mktemp -d` makes it (0700), removed after the test."""
    path = Path(tempfile.mkdtemp(prefix="cae-private-"))
    assert (path.stat().st_mode & 0o777) == 0o700
    try:
        yield path
    finally:
        os.chmod(path, 0o700)
        shutil.rmtree(path, ignore_errors=True)


def _settings(state_dir: Path) -> Settings:
    local = LocalConfig(uid_base=300_000 + secrets.randbelow(20_000) * 64, uid_count=64)
    return Settings(state_dir=state_dir, backends=(local,))


async def test_a_state_dir_the_sandboxes_cannot_reach_is_refused_naming_it(parent: Path) -> None:
    """The probe (server start: `check`) says why, and a rollout is refused as a request (nothing runs, nothing
    is scored). On main: available, and the oracle's correct answer scored 0 (`agent_failed`)."""
    settings = _settings(parent / "state")
    async with Backends(settings) as backends:
        status = backends.get("local").check()
        assert not status.available
        assert f"cannot pass {parent} (mode 0700)" in status.detail and f"chmod o+x {parent}" in status.detail
        with pytest.raises(BackendRefusedError, match=f"cannot pass {parent} .*chmod o\\+x {parent}"):
            await run_rollout(TASK, settings=settings, backends=backends)
    assert not any((parent / "state").iterdir())  # nothing was made, nothing ran, nothing scored


async def test_a_setup_failure_of_bwrap_itself_is_an_infra_error_with_its_cause(parent: Path) -> None:
    os.chmod(parent, 0o711)
    settings = _settings(parent / "state")
    async with Backends(settings) as backends:
        backend = backends.get("local")
        assert backend.check().available  # the probe passed: the server started fine
        box = await backend.create(SandboxSpec(rollout_id="plumbing"))
        try:
            assert (await box.exec(["true"], timeout=30, max_output_bytes=1000)).exit_code == 0
            os.chmod(parent, 0o700)  # an operator's chmod, a tmp cleaner: the server's plumbing breaks
            with pytest.raises(SandboxStartError, match="Can't find source path .*Permission denied"):
                await box.exec(["true"], timeout=30, max_output_bytes=1000)
        finally:
            os.chmod(parent, 0o711)
            await box.close()
        os.chmod(parent, 0o700)
        try:
            result = await run_rollout(TASK, settings=settings, backends=backends)
        finally:
            os.chmod(parent, 0o711)
    assert (result.status, result.reward) == (RolloutStatus.INFRA_ERROR, None), result
    assert result.error is not None and "the sandbox could not start the command" in result.error


async def test_a_command_that_makes_its_own_start_fail_keeps_its_exit_status(settings: Settings) -> None:
    """The agent makes its workdir unreadable: the next command's bwrap cannot `--chdir` there. That is the
    sandbox's own doing (the same binds start a command in `/`), so it is the command's exit status, as before."""
    async with Backends(settings) as backends:
        box = await backends.get("local").create(SandboxSpec(rollout_id="own-doing"))
        try:
            await box.exec(["chmod", "000", box.paths.workdir], timeout=30, max_output_bytes=1000)
            result = await box.exec(["true"], timeout=30, max_output_bytes=1000)
            assert result.exit_code == 1 and b"Can't chdir" in result.stderr
        finally:
            await box.close()


async def test_a_spawned_process_bwrap_could_not_start_is_an_infra_error(parent: Path) -> None:
    """The agent's own process (`spawn`): bwrap's setup failure is `SandboxStartError` from `wait()`, not an
    agent that "exited 1" (which the rollout would score)."""
    os.chmod(parent, 0o711)
    settings = _settings(parent / "state")
    async with Backends(settings) as backends:
        box = await backends.get("local").create(SandboxSpec(rollout_id="spawned"))
        try:
            ok = await box.spawn(["true"])
            assert await ok.wait() == 0
            os.chmod(parent, 0o700)
            broken = await box.spawn(["true"])
            try:
                with pytest.raises(SandboxStartError, match="Can't find source path"):
                    await broken.wait()
            finally:
                await broken.kill()
            os.chmod(parent, 0o711)
            killed = await box.spawn(["sleep", "60"])
            await killed.kill()  # killed by us: a start that was never in doubt
            assert killed.returncode is not None and killed.returncode < 0
        finally:
            os.chmod(parent, 0o711)
            await box.close()
