"""Harbor task directories -> tasks (`models.Task`), run where and as whom they say, or refused.

A task directory holds `task.toml`, `instruction.md`, `environment/` (a `Dockerfile` and what it copies),
`solution/` (`solve.sh` and its helpers), `tests/` (`test.sh`), and for a multi-step task `steps/<name>/`
(`instruction.md`, `tests/`, `solution/`, `workdir/` with an optional `setup.sh`). What each `task.toml` field
becomes, per backend, is docs/how-to/harbor-tasks.md; in short:

- `task_id`: `[task] name` (or a top-level `name`), else the directory's name; the instruction: `instruction.md`;
- the workdir: `[environment] workdir`, else the Dockerfile's last `WORKDIR` (`Task.workdir`): the sandbox shows
  the workspace there or refuses the task; a task without one runs in `/workspace`;
- `solution/` is laid at `/solution` for the oracle only (`Task.solution_files`), which runs `bash
  /solution/solve.sh` with `[solution] env`;
- `tests/` become hidden verify files under `/tests`, verify runs `bash /tests/test.sh`, and the reward must come
  from `/logs/verifier/reward.json` (named metrics) or `reward.txt`;
- users: `[agent] user` and `[verifier] user`, else the Dockerfile's `USER`, else root (Harbor's default: the
  image's user), as root of the sandbox's own user namespace (`Task.agent_user`, `Task.verify_user`);
- timeouts: `[agent] timeout_sec`, `[verifier] timeout_sec` (Harbor's default 600 s); `[environment]` `cpus` /
  `memory_mb` become limits (clamped to the server's caps, noted);
- `[[steps]]`: one `TaskStep` each, `multi_step_reward_strategy` the step reward (`mean` by default);
- `environment/`: on Docker the image is built from it, or `[environment] docker_image` is used as it is; on
  other backends the Dockerfile's `COPY`s are laid (under the workdir in `files`, elsewhere at their paths in
  `outside_files`), its `ENV`s become `env`, instructions that change no file are skipped with a note, and a
  `RUN` refuses the task (naming the Docker backend) unless `TaskOptions.ignore_dockerfile`.

Every file and directory is read through `tasks.confined.TaskDir`: the directory is resolved once, and anything
whose real path leaves it (a link: `task.toml`, `instruction.md`, the `environment/` `tests/` `solution/` roots,
an entry below them, a COPY source) refuses the task with a load error naming the path, before anything of it is
read; a file that is not a regular file (a FIFO, a device) is refused where it is needed, never opened blocking.
"""

from __future__ import annotations

import os
import posixpath
import re
import shlex
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from coding_agent_env.models import SANDBOX_OWN_ENV, RolloutRequest, Task, validation_summary
from coding_agent_env.models.task import RESERVED_ROOTS, SOLUTION_ROOT, check_absolute_path
from coding_agent_env.sandbox.base import STANDARD_PATH
from coding_agent_env.settings import WireLimits
from coding_agent_env.tasks.base import DockerEnvironment, LoadedTask, TaskError, TaskOptions
from coding_agent_env.tasks.confined import TaskDir, TaskFileError
from coding_agent_env.tasks.context import content_hash
from coding_agent_env.tasks.dockerfile import DockerfilePlan, dockerfile_env, parse_dockerfile
from coding_agent_env.tasks.images import map_image, mapped_hash, rewrite_from

__all__ = ["is_harbor_task", "load_harbor_task"]

VERIFY = ["bash /tests/test.sh"]
VERIFIER_TIMEOUT_S = 600.0
"""Harbor's `[verifier] timeout_sec` when a task gives none."""
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TEMPLATE = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*(:-[^}]*)?\}")
DEFAULT_USER = "root"
"""Who Harbor runs the agent and the verifier as when neither the task nor the image names a user."""


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
    agent, verifier, environment, solution = (_table(config, name) for name in ("agent", "verifier", "environment",
                                                                                 "solution"))
    if task.is_dir("environment"):
        task.check_tree("environment")  # Docker would be sent all of it; the files laid here come from it
    dockerfile = "environment/Dockerfile"
    plan = parse_dockerfile(task.read_text(dockerfile)) if task.is_file(dockerfile) else None
    fields: dict[str, Any] = {
        "task_id": _task_name(config) or Path(task.name).name,
        "verify": VERIFY,
        "verify_files_root": "/tests",
        "reward_file_required": True,
        "command_timeout_s": VERIFIER_TIMEOUT_S,
    }
    workdir = environment.get("workdir") or (plan.workdir if plan is not None else None)
    if workdir is not None and workdir != "/":
        if not isinstance(workdir, str):
            raise _Refused("malformed task.toml: [environment].workdir is not a path")
        fields["workdir"] = _claimable(workdir, "workdir")
    image_user = plan.user if plan is not None else None
    fields["agent_user"] = _user(agent, "agent") or image_user or DEFAULT_USER
    fields["verify_user"] = _user(verifier, "verifier") or image_user or DEFAULT_USER
    _solution(task, "solution", fields)
    if solution.get("env"):
        fields["solution_env"] = _literal_env(solution["env"], "solution", notes)
    _timeouts(fields, agent, verifier, notes)
    fields["limits"] = _limits(environment, options, notes)
    _unhonoured(environment, verifier, notes)
    docker_env = _environment(task, fields, environment, plan, options, notes)
    if environment.get("env"):
        fields["env"] = {**fields.get("env", {}), **_literal_env(environment["env"], "environment", notes)}
    if verifier.get("env"):
        # Only verify's: set on its command, never for the agent.
        assigned = " ".join(f"{name}={shlex.quote(value)}"
                            for name, value in _literal_env(verifier["env"], "verifier", notes).items())
        fields["verify"] = [f"{assigned} {command}" if assigned else command for command in VERIFY]
    steps = config.get("steps")
    if steps is not None:
        _steps(task, config, steps, fields, notes)
    else:
        fields["instruction"] = task.read_text("instruction.md")
        fields["verify_files"] = task.text_tree("tests") if task.is_dir("tests") else {}
        if "test.sh" not in fields["verify_files"]:
            raise _Refused("tests/test.sh is missing")
    try:
        loaded = Task.model_validate(fields)
    except ValidationError as exc:
        raise _Refused(f"not a valid request: {validation_summary(exc)}") from None
    return LoadedTask(RolloutRequest.for_task(loaded), task.name, tuple(notes), docker_env)


def _claimable(path: str, what: str) -> str:
    try:
        return check_absolute_path(path, what)
    except ValueError as exc:
        raise _Refused(f"{exc}: no sandbox can run it there") from None


def _user(table: dict[str, Any], section: str) -> str | None:
    user = table.get("user")
    if user is None:
        return None
    if isinstance(user, bool) or not isinstance(user, (str, int)) or str(user).strip() == "":
        raise _Refused(f"malformed task.toml: [{section}].user is not a user name or uid")
    return str(user)


def _literal_env(value: Any, section: str, notes: list[str]) -> dict[str, str]:
    """A `[section].env` table's literal values. A value that is a `${VAR}` template Harbor resolves from the
    operator's environment, which a task may not read here: left out, with a note naming it (not its value)."""
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise _Refused(f"malformed task.toml: [{section}].env must map names to strings")
    bad = sorted(name for name in value if not _ENV_NAME.fullmatch(name))
    if bad:  # a name reaches a shell command (verify's): only variable names
        raise _Refused(f"malformed task.toml: [{section}].env name {bad[0][:40]!r} is not a variable name")
    templated = sorted(name for name, text in value.items() if _TEMPLATE.fullmatch(text.strip()))
    own = sorted(name for name in value if name in SANDBOX_OWN_ENV)
    if templated:
        notes.append(f"[{section}].env {', '.join(templated[:5])} not set: resolved from the operator's environment "
                     "in Harbor, which a task may not read here")
    if own:
        notes.append(f"[{section}].env {', '.join(own)} not set: the sandbox's own")
    return {name: text for name, text in value.items() if name not in templated and name not in own}


def _solution(task: TaskDir, root: str, fields: dict[str, Any]) -> None:
    """`root`'s whole tree (Harbor's `solution/`) as the oracle's `/solution`, and `solve.sh` run there."""
    if not task.is_dir(root):
        return
    files = task.text_tree(root)
    fields["solution_files"] = files
    if "solve.sh" in files:
        fields["solution"] = [f"bash {SOLUTION_ROOT}/solve.sh"]


def _unhonoured(environment: dict[str, Any], verifier: dict[str, Any], notes: list[str]) -> None:
    """What a sandbox here does not do, said once per task."""
    if environment.get("allow_internet") is True or environment.get("network_mode") in ("public", "allowlist"):
        notes.append("internet access not honoured: sandboxes have no internet (only the LLM relay)")
    for key in ("gpus", "tpu", "mcp_servers", "healthcheck", "skills_dir"):
        if environment.get(key):
            notes.append(f"[environment].{key} not honoured")


def _steps(task: TaskDir, config: dict[str, Any], steps: Any, fields: dict[str, Any], notes: list[str]) -> None:
    """`[[steps]]`: each step's instruction, `workdir/` (laid into the workdir; its `setup.sh` run there),
    tests (its own, else the task's), solution (its own, else none) and gate."""
    if not isinstance(steps, list) or not steps or not all(isinstance(step, dict) for step in steps):
        raise _Refused("malformed task.toml: [[steps]] must be a non-empty list of tables")
    strategy = config.get("multi_step_reward_strategy") or "mean"
    if strategy not in ("mean", "final"):
        raise _Refused(f"malformed task.toml: multi_step_reward_strategy {strategy!r} is not mean or final")
    fields["step_reward"] = strategy
    shared_tests = task.text_tree("tests") if task.is_dir("tests") else {}
    out: list[dict[str, Any]] = []
    for step in steps:
        name = step.get("name")
        if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
            raise _Refused("malformed task.toml: a step's name must be a directory name under steps/")
        base = f"steps/{name}"
        # Harbor copies the task's tests/, then the step's over them, into /tests.
        tests = {**shared_tests, **(task.text_tree(f"{base}/tests") if task.is_dir(f"{base}/tests") else {})}
        if "test.sh" not in tests:
            raise _Refused(f"{base}/tests/test.sh is missing (and the task has no tests/test.sh)")
        entry: dict[str, Any] = {"name": name, "instruction": task.read_text(f"{base}/instruction.md"),
                                 "verify_files": tests, "verify": fields["verify"]}
        if task.is_dir(f"{base}/workdir"):
            entry["files"] = task.text_tree(f"{base}/workdir")
            if "setup.sh" in entry["files"]:
                entry["setup"] = ["bash setup.sh"]
        _solution(task, f"{base}/solution" if task.is_dir(f"{base}/solution") else "solution", entry)
        for key in ("min_reward",):
            if step.get(key) is not None:
                entry[key] = step[key]
        step_agent = step.get("agent") if isinstance(step.get("agent"), dict) else {}
        if _user(step_agent, f"steps.{name}.agent") not in (None, fields["agent_user"]):
            notes.append(f"step {name}: [agent].user {step_agent['user']} not honoured per step: the task's is used")
        seconds = _seconds(step_agent, f"steps.{name}.agent")
        if seconds is not None:
            entry["agent_timeout_s"] = min(seconds, WireLimits.MAX_AGENT_TIMEOUT_S)
        out.append(entry)
    fields["steps"] = out
    fields["instruction"] = out[0]["instruction"]


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
    task: TaskDir, fields: dict[str, Any], environment: dict[str, Any], plan: DockerfilePlan | None,
    options: TaskOptions, notes: list[str],
) -> DockerEnvironment | None:
    """Lay out `environment/` for the chosen backend; returns what Docker must build, if anything."""
    prebuilt = environment.get("docker_image")
    if prebuilt is not None and not isinstance(prebuilt, str):
        raise _Refused("malformed task.toml: [environment].docker_image is not an image reference")
    workdir = fields.get("workdir")
    if options.sandbox == "docker" and prebuilt:
        fields["image"] = image = map_image(prebuilt, options.image_map)  # Harbor's prebuilt image, used as it is
        if image != prebuilt:
            notes.append(f"[environment].docker_image {prebuilt} mapped to {image}")
        fields["files"] = _copied_files(task, plan, workdir, strict=False)[0] if plan is not None else {}
        return None
    if plan is None:
        if prebuilt:
            notes.append(f"[environment].docker_image {prebuilt} not used on {options.sandbox}: the sandbox's own "
                         "system runs the task (run it on the Docker backend for the image)")
        fields["files"] = task.text_tree("environment") if task.is_dir("environment") else {}
        return None
    if options.sandbox == "docker":
        # The image holds the files where the Dockerfile put them; what it copied under the workdir is laid there
        # too, so a workdir shown on a fresh volume still has them.
        fields["files"] = _copied_files(task, plan, workdir, strict=False)[0]
        context = task.locate("environment")  # its real path: what is built is what was checked
        text = task.read_text("environment/Dockerfile")
        notes.extend(rewrite_from(text, options.image_map)[1])
        # The tag names the mapped build: a later run without the map never reuses it.
        return DockerEnvironment(context, mapped_hash(content_hash(context), text, options.image_map))
    fields["files"], fields["outside_files"], dropped = _copied_files(
        task, plan, workdir, strict=not options.ignore_dockerfile
    )
    if dropped:
        notes.append(f"Dockerfile COPY destinations not laid on {options.sandbox}: {', '.join(dropped[:5])}"
                     + (" ..." if len(dropped) > 5 else "") + " (the system's own directories)")
    if plan.ignored:
        notes.append(f"Dockerfile instructions that change no file, skipped: {', '.join(plan.ignored[:5])}"
                     + (" ..." if len(plan.ignored) > 5 else ""))
    if plan.unsupported:
        steps = ", ".join(plan.unsupported[:3]) + (" ..." if len(plan.unsupported) > 3 else "")
        if not options.ignore_dockerfile:
            raise _Refused(
                f"its Dockerfile runs commands only Docker can run ({steps}): run it on the Docker backend "
                f"(--sandbox docker), or pass --ignore-dockerfile to run it on {options.sandbox} without them",
                unsupported=True,
            )
        notes.append(f"Dockerfile steps skipped on {options.sandbox}: {steps}")
    env, problems = dockerfile_env(plan, {"PATH": STANDARD_PATH})
    kept = {name: value for name, value in env.items() if name not in SANDBOX_OWN_ENV}
    if kept:
        fields["env"] = kept
    dropped_env = sorted(set(env) - set(kept))
    if dropped_env or problems:
        notes.append(f"Dockerfile ENV not set on {options.sandbox}: {'; '.join(dropped_env + problems)[:200]}"
                     + (" (the sandbox's own)" if dropped_env else ""))
    return None


def _copied_files(
    task: TaskDir, plan: DockerfilePlan, workdir: str | None, *, strict: bool
) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """The files the Dockerfile's COPYs lay: under the workdir (relative to it), elsewhere (absolute), and the
    destinations no sandbox here can lay (the system's own directories). With `strict`, such a destination
    refuses the task: only Docker can honour it."""
    files: dict[str, str] = {}
    outside: dict[str, str] = {}
    dropped: list[str] = []
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
                target = posixpath.normpath(posixpath.join(dest, name) if many else dest)
                content = text if text is not None else task.read_text(rel)
                inside = _under(target, workdir)
                if inside is not None:
                    files[inside] = content
                elif _top(target) in RESERVED_ROOTS or posixpath.dirname(target) == "/":
                    if strict:
                        raise _Refused(f"environment/Dockerfile copies to {target}, the system's own "
                                       f"{_top(target)}: run it on the Docker backend (--sandbox docker)",
                                       unsupported=True)
                    dropped.append(target)
                else:
                    outside[target] = content
    if workdir is not None:
        files.pop("Dockerfile", None)
    return files, outside, dropped


def _under(target: str, workdir: str | None) -> str | None:
    if workdir is None:
        return None
    rel = posixpath.relpath(target, workdir)
    return None if rel == "." or rel.startswith("..") else rel


def _top(path: str) -> str:
    return "/" + path.lstrip("/").split("/", 1)[0]


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
