"""Harbor (Terminal-Bench 2) task directories -> tasks (`models.Task`), run as requests.

A task directory holds `task.toml`, `instruction.md`, `environment/` (a `Dockerfile` and what it copies),
`solution/solve.sh` and `tests/test.sh`. The mapping:

- `task_id`: `task.toml`'s `name` (top level, or in `[task]`), else the directory's name;
- the instruction is `instruction.md`; `[agent].timeout_sec` is the agent's deadline and `[verifier].timeout_sec`
  each command's; `[environment]` `cpus` / `memory_mb` become limits (clamped to the server's, noted),
  `allow_internet = true` and a workdir other than ours are noted as not honoured (sandboxes have no internet;
  commands start in the sandbox's workdir);
- the `oracle` agent runs `solution/solve.sh`;
- `tests/` become hidden verify files under `/tests` (written only for verify, removed with the sandbox), verify
  runs `bash /tests/test.sh`, and the reward must come from `/logs/verifier/reward.txt` or `reward.json`;
- `environment/`: on Docker the image is built from it (`DockerEnvironment`); elsewhere the files its Dockerfile
  `COPY`s into the workdir are laid there, its `ENV`s become the request's `env` (expanded as Docker would, over
  the standard PATH), and a Dockerfile doing more than FROM / WORKDIR / COPY / ENV is refused (naming the Docker
  backend) unless `TaskOptions.ignore_dockerfile`. On Docker the image's own ENV applies (`Sandbox.task_env`).

Every file and directory is read through `tasks.confined.TaskDir`: the directory is resolved once, and anything
whose real path leaves it (a link: `task.toml`, `instruction.md`, the `environment/` `tests/` `solution/` roots,
an entry below them, a COPY source) refuses the task with a load error naming the path, before anything of it is
read; a file that is not a regular file (a FIFO, a device) is refused where it is needed, never opened blocking.
"""

from __future__ import annotations

import os
import posixpath
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from coding_agent_env.models import SANDBOX_OWN_ENV, RolloutRequest, Task, validation_summary
from coding_agent_env.sandbox.base import STANDARD_PATH
from coding_agent_env.settings import WireLimits
from coding_agent_env.tasks.base import DockerEnvironment, LoadedTask, TaskError, TaskOptions
from coding_agent_env.tasks.confined import TaskDir, TaskFileError
from coding_agent_env.tasks.context import content_hash
from coding_agent_env.tasks.dockerfile import DockerfilePlan, dockerfile_env, parse_dockerfile

__all__ = ["is_harbor_task", "load_harbor_task"]

SANDBOX_WORKDIR = "/workspace"
"""Where every backend starts commands (see `SandboxPaths.workdir`)."""


class _Refused(Exception):
    def __init__(self, message: str, *, unsupported: bool = False) -> None:
        super().__init__(message)
        self.unsupported = unsupported


def is_harbor_task(path: Path) -> bool:
    return (path / "task.toml").is_file()


def load_harbor_task(path: Path, options: TaskOptions) -> LoadedTask | TaskError:
    """One Harbor task directory as a request; a `TaskError` naming the directory and the problem otherwise
    (a path leaving the directory, a file that is not a regular file, malformed configuration, ...)."""
    try:
        return _load(TaskDir(path, WireLimits.MAX_FILES_BYTES), options)
    except _Refused as exc:
        return TaskError(str(path), str(exc), unsupported=exc.unsupported)
    except TaskFileError as exc:
        return TaskError(str(path), str(exc))


def _load(task: TaskDir, options: TaskOptions) -> LoadedTask:
    config = _read_toml(task)
    notes: list[str] = []
    agent, verifier, environment = (_table(config, name) for name in ("agent", "verifier", "environment"))
    fields: dict[str, Any] = {
        "task_id": _task_name(config) or Path(task.name).name,
        "instruction": task.read_text("instruction.md"),
        "verify": ["bash /tests/test.sh"],
        "verify_files": task.text_tree("tests"),
        "verify_files_root": "/tests",
        "reward_file_required": True,
    }
    if "test.sh" not in fields["verify_files"]:
        raise _Refused("tests/test.sh is missing")
    if task.is_dir("solution"):
        task.check_tree("solution")
    if task.is_file("solution/solve.sh"):
        fields["solution"] = [task.read_text("solution/solve.sh")]
    _timeouts(fields, agent, verifier, notes)
    fields["limits"] = _limits(environment, options, notes)
    if environment.get("allow_internet") is True:
        notes.append("allow_internet = true not honoured: sandboxes have no internet (only the LLM relay)")
    docker_env = _environment(task, fields, environment, options, notes)
    try:
        loaded = Task.model_validate(fields)
    except ValidationError as exc:
        raise _Refused(f"not a valid request: {validation_summary(exc)}") from None
    return LoadedTask(RolloutRequest.for_task(loaded), task.name, tuple(notes), docker_env)


def _read_toml(task: TaskDir) -> dict[str, Any]:
    text = task.read_text("task.toml")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _Refused(f"malformed task.toml: {exc}") from None


def _table(config: dict[str, Any], name: str) -> dict[str, Any]:
    table = config.get(name, {})
    if not isinstance(table, dict):
        raise _Refused(f"malformed task.toml: [{name}] is not a table")
    return table


def _task_name(config: dict[str, Any]) -> str | None:
    task = config.get("task")
    name = task.get("name") if isinstance(task, dict) else config.get("name")
    return name if isinstance(name, str) and name.strip() else None


def _seconds(table: dict[str, Any], section: str) -> float | None:
    value = table.get("timeout_sec")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise _Refused(f"malformed task.toml: [{section}].timeout_sec must be a positive number")
    return float(value)


def _timeouts(fields: dict[str, Any], agent: dict[str, Any], verifier: dict[str, Any], notes: list[str]) -> None:
    agent_s, verify_s = _seconds(agent, "agent"), _seconds(verifier, "verifier")
    if agent_s is not None:
        if agent_s > WireLimits.MAX_AGENT_TIMEOUT_S:
            notes.append(f"[agent].timeout_sec {agent_s:g} cut to {WireLimits.MAX_AGENT_TIMEOUT_S:g}")
        fields["agent_timeout_s"] = min(agent_s, WireLimits.MAX_AGENT_TIMEOUT_S)
    if verify_s is not None:
        if verify_s > WireLimits.MAX_COMMAND_TIMEOUT_S:
            notes.append(f"[verifier].timeout_sec {verify_s:g} cut to {WireLimits.MAX_COMMAND_TIMEOUT_S:g}")
        fields["command_timeout_s"] = min(verify_s, WireLimits.MAX_COMMAND_TIMEOUT_S)


def _limits(environment: dict[str, Any], options: TaskOptions, notes: list[str]) -> dict[str, Any] | None:
    limits: dict[str, Any] = {}
    for key in ("cpus", "memory_mb"):
        value = environment.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise _Refused(f"malformed task.toml: [environment].{key} must be a positive number")
        cap = getattr(options.caps, key, None) if options.caps is not None else None
        if cap and value > cap:
            notes.append(f"[environment].{key} {value:g} cut to this server's cap of {cap:g}")
            value = cap
        limits[key] = int(value) if key == "memory_mb" else float(value)
    return limits or None


def _environment(
    task: TaskDir, fields: dict[str, Any], environment: dict[str, Any], options: TaskOptions, notes: list[str]
) -> DockerEnvironment | None:
    """Lay out `environment/` for the chosen backend; returns what Docker must build, if anything. The whole
    directory is checked first: Docker would be sent all of it, and the files laid here come from it."""
    if task.is_dir("environment"):
        task.check_tree("environment")
    dockerfile = "environment/Dockerfile"
    plan = parse_dockerfile(task.read_text(dockerfile)) if task.is_file(dockerfile) else None
    workdir = environment.get("workdir") or (plan.workdir if plan is not None else None)
    if isinstance(workdir, str) and workdir not in ("/", SANDBOX_WORKDIR):
        notes.append(f"workdir {workdir} not honoured: commands start in {SANDBOX_WORKDIR}, where the task's "
                     "files are laid")
    if plan is None:
        fields["files"] = task.text_tree("environment") if task.is_dir("environment") else {}
        return None
    if options.sandbox == "docker":
        # The image holds the files where the Dockerfile put them, but the sandbox's workdir may be a fresh
        # volume (Docker's disk budget) and its WORKDIR may not be ours: what it copied under its WORKDIR is
        # laid into ours too, so the agent starts beside them.
        fields["files"] = _copied_files(task, plan, strict=False)
        context = task.locate("environment")  # its real path: what is built is what was checked
        return DockerEnvironment(context, content_hash(context))
    fields["files"] = _copied_files(task, plan, strict=not options.ignore_dockerfile)
    if plan.unsupported:
        steps = ", ".join(plan.unsupported[:3]) + (" ..." if len(plan.unsupported) > 3 else "")
        if not options.ignore_dockerfile:
            raise _Refused(
                f"its Dockerfile does more than FROM / WORKDIR / COPY / ENV ({steps}): run it on the Docker "
                f"backend (--sandbox docker), or pass --ignore-dockerfile to run it on {options.sandbox} anyway",
                unsupported=True,
            )
        notes.append(f"Dockerfile steps skipped on {options.sandbox}: {steps}")
    env, problems = dockerfile_env(plan, {"PATH": STANDARD_PATH})
    kept = {name: value for name, value in env.items() if name not in SANDBOX_OWN_ENV}
    if kept:
        fields["env"] = kept
    dropped = sorted(set(env) - set(kept))
    if dropped or problems:
        notes.append(f"Dockerfile ENV not set on {options.sandbox}: {'; '.join(dropped + problems)[:200]}"
                     + (" (the sandbox's own)" if dropped else ""))
    return None


def _copied_files(task: TaskDir, plan: DockerfilePlan, *, strict: bool) -> dict[str, str]:
    """The files the Dockerfile's COPYs put under its WORKDIR, by path relative to it. With `strict`, a COPY
    elsewhere (or any COPY without a WORKDIR) is refused: only Docker can honour it."""
    files: dict[str, str] = {}
    context = task.locate("environment")
    for copy in plan.copies:
        for source in copy.sources:
            rel = posixpath.normpath(posixpath.join("environment", source))
            src = task.locate(rel)  # refuses a source leaving the task directory
            if not (src == context or src.is_relative_to(context)) or not src.exists():
                raise _Refused(f"environment/Dockerfile copies {source!r}, which is not in environment/")
            many = src.is_dir() or len(copy.sources) > 1 or copy.dest.endswith("/")
            dest = copy.dest.rstrip("/") or "/"
            items = task.text_tree(rel).items() if src.is_dir() else [(posixpath.basename(rel), None)]
            for name, text in items:
                target = posixpath.join(dest, name) if many else dest
                inside = _under_workdir(target, plan.workdir, strict=strict)
                if inside is not None:
                    files[inside] = text if text is not None else task.read_text(rel)
    files.pop("Dockerfile", None)
    return files


def _under_workdir(target: str, workdir: str, *, strict: bool) -> str | None:
    rel = posixpath.relpath(target, workdir)
    if workdir == "/" or rel == "." or rel.startswith(".."):
        if not strict:
            return None
        raise _Refused(f"environment/Dockerfile copies to {target}, outside its WORKDIR {workdir}: run it on the "
                       "Docker backend (--sandbox docker)", unsupported=True)
    return rel


def iter_harbor_dir(path: Path, options: TaskOptions) -> Iterator[LoadedTask | TaskError]:
    """A task directory, or a directory of them (each subdirectory with a `task.toml`, in name order). A task
    that is a link leaving the directory of tasks is refused (naming it), not read: a task elsewhere is loaded by
    passing its own path."""
    if is_harbor_task(path):
        yield load_harbor_task(path, options)
        return
    real = Path(os.path.realpath(path))
    for child in sorted(path.iterdir()):
        leaves = child.is_symlink() and not Path(os.path.realpath(child)).is_relative_to(real)
        if leaves and is_harbor_task(child):  # other links (a README, a data directory) are not tasks: ignored
            yield TaskError(str(child), "a link leaving the directory of tasks: refused, nothing of it is read "
                                        "(pass the task's own path to load it)")
        elif child.is_dir() and is_harbor_task(child):
            yield load_harbor_task(child, options)
        elif child.is_dir() and ((child / "instruction.md").exists() or (child / "tests").is_dir()):
            yield TaskError(str(child), "task.toml is missing")
