"""Run the verify commands after the agent, in a context the agent cannot have prepared.

Contract: called only once the agent's whole process tree is dead. The verifier directory is deleted and
made anew (so a planted reward file, or a symlink in its place, is gone), then each command runs through
the task-command runner in a fresh context (a new private HOME and /tmp, the standard PATH) with
`REWARD_FILE` set, under its own timeout. `Hardening` (the default of every task, see `verify_env`) adds
Python's safe path and no user site, the sandbox's path guard as PYTHONPATH's one entry where it has one (the
directory Python would put first goes last: the agent's modules import, yet shadow nothing installed), empties
the code-injecting variables and drops search-path entries inside the sandbox's writable roots, whatever the
task's environment says. Afterwards the reward files verify wrote,
if the caller counts them, are read back (bounded: `reward.txt` and Harbor's `reward.json` in the same
directory, each as text, or why it could not be read); one the caller does not count is reported as ignored.
Which file wins and what it is worth is `score`'s job.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from coding_agent_env.errors import SandboxFileError, SandboxFileNotFoundError, SandboxUnavailableError
from coding_agent_env.models import CommandResult
from coding_agent_env.workspace.verify.score import MAX_REWARD_JSON_CHARS, RewardText, Unreadable
from coding_agent_env.workspace.commands import CommandRunner
from coding_agent_env.sandbox.base import STANDARD_PATH, Sandbox
from coding_agent_env.verify_env import AGENT_WRITABLE_ROOTS, hardened_overlay

__all__ = ["VerifyOutcome", "run_verify", "tests_dir", "verified_env", "verifier_dir"]

_REWARD_READ_BYTES = 4096
"""Bytes of `reward.txt` read (a number is at most 64 characters: more is refused by `score` anyway)."""
_REWARD_FILES = ("reward.txt", "reward.json")


@dataclass(frozen=True)
class VerifyOutcome:
    results: list[CommandResult]
    reward_text: RewardText
    """`reward.txt` as verify left it: its text, why it could not be read (`Unreadable`), or None if absent."""
    reward_problem: str | None = None
    """Why the reward files are not used at all (the caller does not count them); both are then None."""
    reward_json: RewardText = None
    """`reward.json` as verify left it, as `reward_text` is."""


def verifier_dir(sandbox: Sandbox) -> str:
    return f"{sandbox.paths.logs}/verifier"


def tests_dir(sandbox: Sandbox) -> str:
    """The directory the sandbox shows at `/tests`; SandboxError when it shows none."""
    if sandbox.paths.tests is None:
        raise SandboxUnavailableError(
            f"this sandbox ({sandbox.isolation} isolation) cannot show hidden tests at /tests; "
            "use the local backend with bubblewrap, or Docker"
        )
    return f"{sandbox.paths.logs}/tests"


def verified_env(
    sandbox: Sandbox, env: Mapping[str, str], *, hardened: bool, task_roots: Sequence[str] = ()
) -> dict[str, str]:
    """What verify adds to each command's base environment: `env`, then (`hardened`) the overlay that
    `verify_env.hardened_overlay` computes against the sandbox's own roots, the task's further ones
    (`task_roots`: the agent could write them too) and the standard ones, with the sandbox's path guard
    (`Sandbox.path_guard`), then `REWARD_FILE` (verify's own, always)."""
    out = dict(env)
    if hardened:
        paths = sandbox.paths
        roots = (*AGENT_WRITABLE_ROOTS, paths.workdir, paths.home, paths.tmp, paths.logs, *task_roots)
        out |= hardened_overlay({**sandbox.base_env(), **env}, roots, fallback_path=STANDARD_PATH,
                                guard=sandbox.path_guard)
    out["REWARD_FILE"] = f"{verifier_dir(sandbox)}/reward.txt"
    return out


async def run_verify(
    runner: CommandRunner,
    commands: Sequence[str],
    *,
    on_result: Callable[[int, CommandResult], None],
    env: Mapping[str, str] | None = None,
    hardened: bool = True,
    task_roots: Sequence[str] = (),
    uncounted_reward_file: str | None = None,
) -> VerifyOutcome:
    """Run `commands` in order (each one's result to `on_result` as it ends), then read the reward files back.
    `env` is added to each command's environment (see `verified_env`). With `uncounted_reward_file` (why a reward
    file does not count), those verify left are not used: the outcome's `reward_problem` says one was ignored,
    and why."""
    sandbox = runner.sandbox
    directory = verifier_dir(sandbox)
    await sandbox.remove(directory)
    await sandbox.mkdir(directory)
    command_env = verified_env(sandbox, env or {}, hardened=hardened, task_roots=task_roots)
    results: list[CommandResult] = []
    for index, cmd in enumerate(commands):
        result = await runner.run(cmd, fresh=True, env=command_env)
        results.append(result)
        on_result(index, result)
    read = {name: await _read_reward_file(sandbox, f"{directory}/{name}") for name in _REWARD_FILES}
    if uncounted_reward_file is not None:
        for name in _REWARD_FILES:
            if read[name] is not None:
                return VerifyOutcome(results, None, f"{name} ignored: {uncounted_reward_file}")
        return VerifyOutcome(results, None)
    return VerifyOutcome(results, read["reward.txt"], reward_json=read["reward.json"])


async def _read_reward_file(sandbox: Sandbox, path: str) -> RewardText:
    """A reward file's text (bounded; UTF-8 with replacement), `Unreadable` with why, or None when missing.
    `reward.json` is read one byte past its bound, so a longer one is refused as such, not cut into bad JSON."""
    limit = MAX_REWARD_JSON_CHARS if path.endswith(".json") else _REWARD_READ_BYTES
    try:
        raw = await sandbox.read_bytes(path, max_bytes=limit + 1)
    except SandboxFileNotFoundError:
        return None
    except SandboxFileError as exc:
        return Unreadable(str(exc))
    if path.endswith(".json") and len(raw) > limit:
        return Unreadable(f"longer than {limit} bytes")
    return raw[:limit].decode("utf-8", "replace")
