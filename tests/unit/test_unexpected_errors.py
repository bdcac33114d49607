"""An unexpected exception while a rollout or an episode handles what the sandbox left never raises out of it and
never makes it unscored (DESIGN.md, "Everything a sandbox produces is untrusted"): in verify it scores 0 with a
note and a typed error, in collect the files are omitted with a note, before the agent's output is read it is a
typed infra_error; the sandbox is torn down either way.

The exception comes from a real bubblewrap sandbox whose file operations on chosen paths raise what a recursive
walk of an agent-made deep tree raised (`RecursionError`): a stand-in backend passed to `Backends` as an override.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import pytest

from coding_agent_env.episode import Episode, EpisodeStatus, parse_task
from coding_agent_env.models import RolloutRequest, RolloutResult, RolloutStatus
from coding_agent_env.rollout import run_rollout
from coding_agent_env.sandbox import Backends
from coding_agent_env.sandbox.base import (
    BackendStatus,
    ExecResult,
    FileEntry,
    Process,
    Sandbox,
    SandboxBackend,
    SandboxSpec,
)
from coding_agent_env.settings import Settings

Trap = Callable[[str, str], bool]
"""(operation, sandbox path) -> whether it raises."""


class TrappedSandbox(Sandbox):
    """A real sandbox whose file operations raise `RecursionError` where `trap` says (all else is the real one)."""

    def __init__(self, real: Sandbox, trap: Trap) -> None:
        super().__init__()
        self.real, self.trap = real, trap
        for name in ("backend", "id", "isolation", "paths", "relay_url", "agents_dir", "shell", "network", "limits",
                     "limit_scopes", "task_env"):
            setattr(self, name, getattr(real, name))

    def _check(self, operation: str, path: str) -> None:
        if self.trap(operation, path):
            raise RecursionError("maximum recursion depth exceeded")

    async def exec(self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
                   cwd: str | None = None, fresh: bool = False, max_output_bytes: int,
                   user: str | None = None) -> ExecResult:
        return await self.real.exec(argv, timeout=timeout, env=env, cwd=cwd, fresh=fresh,
                                    max_output_bytes=max_output_bytes, user=user)

    async def spawn(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None,
                    log_path: str | None = None, user: str | None = None) -> Process:
        return await self.real.spawn(argv, env=env, cwd=cwd, log_path=log_path, user=user)

    async def read_bytes(self, path: str, *, max_bytes: int | None = None, tail: bool = False) -> bytes:
        self._check("read", path)
        return await self.real.read_bytes(path, max_bytes=max_bytes, tail=tail)

    async def write_bytes(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        self._check("write", path)
        await self.real.write_bytes(path, data, mode=mode)

    async def mkdir(self, path: str) -> None:
        await self.real.mkdir(path)

    async def remove(self, path: str) -> None:
        self._check("remove", path)
        await self.real.remove(path)

    async def list_files(self, path: str, *, max_entries: int) -> tuple[list[FileEntry], bool]:
        self._check("list", path)
        return await self.real.list_files(path, max_entries=max_entries)

    async def limits_hit(self) -> list[str]:
        return await self.real.limits_hit()

    async def _close(self) -> None:
        await self.real.close()


class TrappedBackend(SandboxBackend):
    """The real local backend, its sandboxes trapped."""

    name = "local"

    def __init__(self, real: SandboxBackend, trap: Trap) -> None:
        self.real, self.trap = real, trap

    def check(self) -> BackendStatus:
        return self.real.check()

    async def refusal(self) -> str | None:
        return await self.real.refusal()

    def network_refusal(self, network: str) -> str | None:
        return self.real.network_refusal(network)

    async def create(self, spec: SandboxSpec) -> Sandbox:
        return TrappedSandbox(await self.real.create(spec), self.trap)

    async def aclose(self) -> None:
        await self.real.aclose()


async def _rollout(settings: Settings, request: RolloutRequest, trap: Trap) -> RolloutResult:
    async with Backends(settings) as real:
        async with Backends(settings, overrides={"local": TrappedBackend(real.get("local"), trap)}) as backends:
            return await run_rollout(request, settings=settings, backends=backends)


TASK = RolloutRequest(instruction="x", agent="oracle", sandbox="local", solution=["echo hi > hello.txt"],
                      verify=["grep -qx hi hello.txt"])


async def test_an_unexpected_error_in_verify_scores_zero_typed(settings: Settings, assert_no_leftovers: None) -> None:
    # Verify clears the verifier directory first: where an agent-made deep tree made a recursive removal raise.
    result = await _rollout(settings, TASK, lambda op, path: op == "remove" and path.endswith("/verifier"))
    assert (result.status, result.reward) == (RolloutStatus.COMPLETED, 0.0)
    assert result.reward_note == "verify could not complete on what the agent left (RecursionError): scored 0"
    assert result.error_detail is not None and (result.error_detail.type, result.error_detail.stage) == (
        "RecursionError", "verify")
    assert result.files == {"hello.txt": "hi\n"}  # collect still ran


async def test_an_unexpected_error_in_collect_omits_the_files(settings: Settings, assert_no_leftovers: None) -> None:
    result = await _rollout(settings, TASK, lambda op, path: op == "list")
    assert (result.status, result.reward) == (RolloutStatus.COMPLETED, 1.0)  # the honest reward stands
    assert result.files == {} and result.files_extra == ["... (collecting failed on what the agent left: "
                                                         "RecursionError)"]
    assert result.error_detail is not None and result.error_detail.stage == "collect"


async def test_an_unexpected_error_before_the_agent_is_a_typed_infra_error(
    settings: Settings, assert_no_leftovers: None
) -> None:
    request = TASK.model_copy(update={"files": {"notes.txt": "x"}})
    result = await _rollout(settings, request, lambda op, path: op == "write" and path.endswith("notes.txt"))
    assert (result.status, result.reward) == (RolloutStatus.INFRA_ERROR, None)
    assert result.error == "RecursionError in provision: maximum recursion depth exceeded"


@pytest.mark.parametrize("when", ["verify", "start"])
async def test_an_episode_ends_typed_and_torn_down(settings: Settings, assert_no_leftovers: None, when: str) -> None:
    task = parse_task({"instruction": "x", "sandbox": "local", "files": {"notes.txt": "x"},
                       "verify_scripts": 'test "$(cat "$FINAL_ANSWER_FILE")" = 42'})

    def trap(op: str, path: str) -> bool:
        if when == "verify":
            return op == "remove" and path.endswith("/verifier")
        return op == "write" and path.endswith("notes.txt")

    async with Backends(settings) as real:
        async with Backends(settings, overrides={"local": TrappedBackend(real.get("local"), trap)}) as backends:
            episode = await Episode.start(task, settings=settings, backends=backends)
            try:
                if when == "start":
                    assert episode.status is EpisodeStatus.INFRA_ERROR and episode.sandbox is not None
                    assert episode.sandbox.closed
                    assert episode.report().error is not None and episode.report().error.type == "RecursionError"
                    return
                report = await episode.final_answer("42")
            finally:
                await episode.close()
    assert (report.status, report.reward, report.done) == (EpisodeStatus.COMPLETED, 0.0, True)
    assert report.reward_note is not None and "(RecursionError): scored 0" in report.reward_note
    assert report.error is not None and (report.error.type, report.error.stage) == ("RecursionError", "verify")
