"""`Task`: what is to be done and how it is checked, whoever does it.

A task is the instruction, the files and commands around it (setup, verify, hidden verify files, artifacts, the
reference solution), where it runs (sandbox, image, environment, limits) and its deadlines. Nothing about an
agent or an LLM: `RolloutRequest` adds those. A rollout's request, an episode's `reset` arguments and every
task-set loader compose this one model, so a new task field is declared here once, with its validation, and
reaches all three (see docs/concepts/rollouts.md).

Validation is structural (types, sizes, path shapes); whether a named backend is enabled, or limits are within
the server's caps, is the server's business.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from coding_agent_env.models.common import WireModel, name_field
from coding_agent_env.settings import WireLimits
from coding_agent_env.verify_env import AGENT_WRITABLE_ROOTS, workspace_entry

__all__ = ["RESERVED_ROOTS", "SANDBOX_OWN_ENV", "SOLUTION_ROOT", "LimitsRequest", "Task", "TaskStep", "check_absolute_path",
           "check_relative_path", "check_user"]

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SANDBOX_OWN_ENV = frozenset({"HOME", "TMPDIR", "USER", "LOGNAME", "REWARD_FILE"})
"""Variables that are the sandbox's (or verify's) own: neither a request's `env` nor an image's ENV sets them."""


def check_relative_path(path: str, what: str = "file path") -> str:
    """Normalise a workdir-relative path; refuse absolute paths, `..`, NUL and empty names."""
    if not path or "\x00" in path:
        raise ValueError(f"{what} must be a non-empty string without NUL bytes")
    if len(path.encode()) > WireLimits.MAX_PATH_BYTES:
        raise ValueError(f"{what} longer than {WireLimits.MAX_PATH_BYTES} bytes")
    if path.startswith("/") or path.startswith("\\"):
        raise ValueError(f"{what} {path!r} is absolute; paths are relative to the workdir")
    parts = path.replace("\\", "/").split("/")
    if ".." in parts:
        raise ValueError(f"{what} {path!r} contains '..'")
    normal = posixpath.normpath("/".join(parts))
    if normal in (".", ""):
        raise ValueError(f"{what} {path!r} names the workdir itself")
    return normal


RESERVED_ROOTS = frozenset({
    "/", "/proc", "/sys", "/dev", "/run", "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
    "/boot", "/var", "/home", "/tmp", "/logs", "/tests", "/solution", "/opt", "/root", "/nix", "/snap",
})
"""Top-level directories a task may not claim as its workdir or lay files into: the system's own (the sandbox
shows the host's or the image's, read-only), and the sandbox's own layout (`SandboxPaths`, `/tests`,
`/solution`). A workdir or file may lie one level below some of them (`/opt/app`? no: `/opt` is where agents
are; `/srv/app`, `/app`, `/data/x` are fine)."""

SOLUTION_ROOT = "/solution"
"""Where the reference solution's files (`Task.solution_files`) are laid, for the oracle only (Harbor's place)."""

_USER = re.compile(r"(?:[a-z_][a-z0-9_-]{0,31}|[0-9]{1,9})")


def check_absolute_path(path: str, what: str = "path") -> str:
    """Normalise an absolute path a task claims (its workdir, a file it lays outside the workdir); refuse
    relative paths, `..`, NUL, and the system's and sandbox's own directories (`RESERVED_ROOTS`)."""
    if not path or "\x00" in path:
        raise ValueError(f"{what} must be a non-empty string without NUL bytes")
    if len(path.encode()) > WireLimits.MAX_PATH_BYTES:
        raise ValueError(f"{what} longer than {WireLimits.MAX_PATH_BYTES} bytes")
    if not path.startswith("/"):
        raise ValueError(f"{what} {path!r} is not absolute")
    if ".." in path.split("/"):
        raise ValueError(f"{what} {path!r} contains '..'")
    normal = posixpath.normpath(path)
    top = "/" + normal.lstrip("/").split("/", 1)[0]
    if normal in RESERVED_ROOTS or top in RESERVED_ROOTS:
        raise ValueError(f"{what} {path!r} is inside {top}, which is the system's or the sandbox's own")
    return normal


def check_user(user: str, what: str = "user") -> str:
    """A user a command runs as inside the sandbox: a name (`root`, `nobody`, `app`) or a numeric uid."""
    if not _USER.fullmatch(user):
        raise ValueError(f"{what} {user[:40]!r} is not a user name or uid")
    return user


def _commands(description: str) -> Any:
    """A list of shell commands, empty unless given, bounded (each command is checked by `_commands_bounded`)."""
    return Field(default_factory=list, max_length=WireLimits.MAX_COMMANDS, description=description)


class LimitsRequest(WireModel):
    """Sandbox limits a request asks for; each at most the server's (`SANDBOX_MEMORY_MB`, `SANDBOX_DISK_MB`,
    `SANDBOX_MAX_PROCESSES`, `SANDBOX_CPUS`), which also stand for what is not given."""

    memory_mb: int | None = Field(default=None, ge=16, description="Memory of the whole sandbox, MB.")
    disk_mb: int | None = Field(default=None, ge=1, description="Disk the sandbox may write, MB.")
    max_processes: int | None = Field(default=None, ge=8, description="Processes and threads of the whole sandbox.")
    cpus: float | None = Field(default=None, gt=0, le=1024, description="CPUs the sandbox may use at once.")


class Task(WireModel):
    """One task: an instruction, its files and commands, where it runs and its deadlines."""

    UNSET_WHEN_EMPTY: ClassVar[frozenset[str]] = frozenset(
        ("task_id", "group_id", "image", "template", "sandbox", "setup", "verify")
    )
    """Fields for which upstream clients send "" or null to mean "not given"."""

    instruction: str = Field(
        min_length=1,
        max_length=WireLimits.MAX_INSTRUCTION_CHARS,
        description="The task given to the agent, verbatim. It reaches the agent through a file, never argv.",
    )
    setup: list[str] = _commands(
        "Shell commands run in order in the workdir before the agent; the first failure stops "
        "the rollout with status setup_failed and reward null."
    )
    verify: list[str] = _commands(
        "Shell commands run after the agent's process tree is dead. Reward: a number in [0,1] "
        "written to $REWARD_FILE, else the fraction of verify commands that exit 0."
    )
    files: dict[str, str] = Field(
        default_factory=dict,
        description="Text files written into the workdir before setup: relative path -> content.",
    )
    verify_files: dict[str, str] = Field(
        default_factory=dict,
        description="Hidden test files: relative path -> content, written only for verify (never visible during "
        "setup or the agent's phase), replacing whatever the agent left at those paths.",
    )
    verify_files_root: Literal["workdir", "/tests"] = Field(
        default="workdir",
        description="Where `verify_files` are placed for verify: relative to the workdir, or under `/tests` (Harbor's "
        "layout; the directory is made afresh just before verify and removed with the sandbox). `/tests` needs a "
        "backend that can show it (local bubblewrap, Docker); elsewhere the rollout ends as an infra_error.",
    )
    reward_file_required: bool = Field(
        default=False,
        description="Whether verify must write the reward file (Harbor's rule): when it writes none, the reward is 0 "
        "and `reward_note` says so, instead of the fraction of verify commands that passed.",
    )
    artifacts: list[str] = Field(
        default_factory=list,
        max_length=WireLimits.MAX_ARTIFACT_PATTERNS,
        description="What the agent is expected to produce or change: workdir-relative paths or glob patterns "
        "(`*`, `?`, `[...]`; `*` also matches `/`). When given, verify runs in a clean room: a fresh sandbox "
        "with `files`, these artifacts (regular files only) and `verify_files`, and nothing else the agent wrote.",
    )
    solution: list[str] = _commands(
        "Reference solution commands, run by the 'oracle' agent in place of an LLM agent."
    )
    sandbox: str | None = name_field(
        "Sandbox backend, one of those the server enabled; default: the server's default backend."
    )
    image: str | None = name_field(
        "Container image or template for backends that use one; ignored by the local backend. "
        "`template` (OpenEnv's opencode_env name for it) is accepted as the same field."
    )
    agent_timeout_s: float = Field(
        default=600.0,
        gt=0,
        le=WireLimits.MAX_AGENT_TIMEOUT_S,
        description="Deadline for the agent; at the deadline its whole process tree is killed (agent_timeout).",
    )
    command_timeout_s: float = Field(
        default=120.0,
        gt=0,
        le=WireLimits.MAX_COMMAND_TIMEOUT_S,
        description="Deadline for each setup and verify command.",
    )
    limits: LimitsRequest | None = Field(
        default=None, description="Sandbox limits, each within the server's own (which stand for what is not given)."
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        max_length=WireLimits.MAX_ENV_VARS,
        description="Environment variables for every command in the sandbox (setup, the agent, verify), over the "
        "image's own ENV: PATH may be set; HOME, TMPDIR, USER, LOGNAME and REWARD_FILE are the sandbox's. "
        "A Harbor task's Dockerfile ENV arrives here on backends that do not build its image.",
    )
    verify_hardening: bool = Field(
        default=True,
        description="Verify runs hardened: Python with PYTHONSAFEPATH=1 and PYTHONNOUSERSITE=1, and, where the "
        "sandbox has a path guard (local and Docker: docs/verify.md), the directory Python would put first (the "
        "workdir for `-c`/`-m`, a script's own directory) put LAST on sys.path instead: the agent's modules "
        "import as before but shadow nothing of the standard library or installed packages (a module of the "
        "workdir named like one of those, e.g. test.py, is not the one imported); without a guard that directory "
        "is not on the path at all. The task's PYTHONPATH, PYTHONHOME, PYTHONSTARTUP, LD_PRELOAD, "
        "LD_LIBRARY_PATH, LD_AUDIT, BASH_ENV and ENV are not used, and search-path entries (PATH, NODE_PATH, "
        "...) inside places the agent can write are dropped; `env` may then not point a search-path variable "
        "into them (refused). In a clean room, a reward file counts only with `reward_file_required` "
        "(the artifacts verify runs could write one). false: none of this.",
    )
    workdir: str | None = Field(
        default=None,
        description="Where the task runs: an absolute path (`/app`) where the workspace is shown, `files` are "
        "laid, and setup, the agent, verify and an episode's shell start. null: the sandbox's own (`/workspace`). "
        "A backend that cannot show the workspace there refuses the task, naming `workdir`; it never runs it "
        "elsewhere. Not inside the system's or the sandbox's own directories.",
    )
    outside_files: dict[str, str] = Field(
        default_factory=dict,
        description="Text files laid at absolute paths outside the workdir before setup (what a Harbor task's "
        "Dockerfile `COPY`s to `/queries`, say): absolute path -> content. Their top-level directories are made "
        "writable for the task; a backend that cannot refuses the task naming `outside_files`.",
    )
    solution_files: dict[str, str] = Field(
        default_factory=dict,
        description="The reference solution's files (Harbor's `solution/`), laid at `/solution` for the 'oracle' "
        "agent only, which runs `solution` there; never shown to any other agent.",
    )
    solution_env: dict[str, str] = Field(
        default_factory=dict,
        max_length=WireLimits.MAX_ENV_VARS,
        description="Variables added for the 'oracle' agent's `solution` commands (Harbor's `[solution] env`).",
    )
    agent_user: str | None = Field(
        default=None,
        description="Who the agent (and an episode's shell) runs as inside the sandbox: a user name or uid. null: "
        "the sandbox's own unprivileged user. `root` is root of the sandbox's own user namespace (no host "
        "privilege). A backend that cannot run as another user refuses the task, naming `agent_user`.",
    )
    verify_user: str | None = Field(
        default=None,
        description="Who setup and verify run as (a user name or uid; Harbor's `[verifier] user`, root by "
        "default for Harbor tasks): root of the sandbox's own user namespace, with enough mapped ids that it "
        "may switch to another user (`nobody`). null: the sandbox's own unprivileged user.",
    )
    reward_metric: str | None = Field(
        default=None,
        max_length=WireLimits.MAX_NAME_CHARS,
        description="Which named metric of a multi-metric `reward.json` is the scalar `reward` (every metric is "
        "kept in the result's `rewards`). null: `reward` if present, else the single metric, else the mean of "
        "them (docs/how-to/harbor-tasks.md).",
    )
    steps: list[TaskStep] = Field(
        default_factory=list,
        max_length=WireLimits.MAX_COMMANDS,
        description="A multi-step task (Harbor's `[[steps]]`): each step runs in order in the same sandbox with its "
        "own instruction, files, setup, hidden tests, verify and solution; a step whose reward is below its "
        "`min_reward` ends the task. The task's own instruction is the first step's. Empty: one step, the task.",
    )
    step_reward: Literal["mean", "final"] = Field(
        default="mean",
        description="A multi-step task's reward: the mean of the rewards of the steps that were verified (steps a "
        "gate cut off are left out, as Harbor does; each named metric averaged the same way, a metric a step "
        "lacks counting 0), or the last verified step's (Harbor's `multi_step_reward_strategy`).",
    )
    task_id: str | None = name_field("Caller's id for the task, echoed in the result.")
    group_id: str | None = Field(
        default=None,
        max_length=WireLimits.MAX_NAME_CHARS,
        pattern=r"^[!-~]+$",
        description="A group of rollouts of this task (GRPO's G members): the first member to start sets the "
        "sandbox up (the task's files and setup commands) once, and every member of the group starts from a "
        "copy-on-write fork of that state, in a sandbox of its own (own processes, writes, network and limits; "
        "processes do not fork). Members share a group only when everything their sandbox and setup depend on is "
        "the same; a backend that cannot fork runs the setup in every member. The result's `group` says which "
        "way it ran. A failed setup fails every member of the group with the same results.",
    )
    group_size: int | None = Field(
        default=None,
        ge=1,
        description="How many members the group has (GRPO's G), when the caller knows: once that many have "
        "joined and the last has ended, the group's set-up template is released at once instead of kept idle "
        "for later members (the first member's value counts). Without it the template is kept `GROUP_IDLE_S`.",
    )

    @model_validator(mode="before")
    @classmethod
    def _upstream_arguments(cls, data: Any) -> Any:
        """OpenEnv's `OpenCodeEnv` / `PiEnv` clients send every argument: "" and null mean "not given"."""
        if not isinstance(data, dict):
            return data
        unset = cls.UNSET_WHEN_EMPTY
        data = {key: value for key, value in data.items() if not (key in unset and value in ("", None))}
        if "template" in data:
            template = data.pop("template")
            if "image" in data and data["image"] != template:
                raise ValueError("give image or template (the same field), not both")
            data["image"] = template
        return data

    @field_validator("workdir")
    @classmethod
    def _workdir_claimable(cls, workdir: str | None) -> str | None:
        return None if workdir is None else check_absolute_path(workdir, "workdir")

    @field_validator("agent_user", "verify_user")
    @classmethod
    def _users(cls, user: str | None) -> str | None:
        return None if user is None else check_user(user)

    @field_validator("outside_files")
    @classmethod
    def _outside_files_claimable(cls, files: dict[str, str]) -> dict[str, str]:
        if len(files) > WireLimits.MAX_FILES:
            raise ValueError(f"at most {WireLimits.MAX_FILES} files")
        out = {check_absolute_path(path, "file path"): text for path, text in files.items()}
        if len(out) != len(files):
            raise ValueError("a file path is given twice")
        return out

    @field_validator("files", "verify_files", "solution_files")
    @classmethod
    def _files_confined(cls, files: dict[str, str]) -> dict[str, str]:
        if len(files) > WireLimits.MAX_FILES:
            raise ValueError(f"at most {WireLimits.MAX_FILES} files")
        total = 0
        out: dict[str, str] = {}
        for path, text in files.items():
            normal = check_relative_path(path)
            if normal in out:
                raise ValueError(f"file path {path!r} given twice")
            total += len(text.encode("utf-8", "surrogatepass"))
            out[normal] = text
        if total > WireLimits.MAX_FILES_BYTES:
            raise ValueError(f"files total more than {WireLimits.MAX_FILES_BYTES} bytes")
        return out

    @field_validator("artifacts")
    @classmethod
    def _artifacts_confined(cls, patterns: list[str]) -> list[str]:
        return [check_relative_path(pattern, "artifact") for pattern in patterns]

    @field_validator("setup", "verify", "solution")
    @classmethod
    def _commands_bounded(cls, commands: list[str]) -> list[str]:
        for cmd in commands:
            if not cmd.strip():
                raise ValueError("commands must not be empty")
            if len(cmd.encode("utf-8", "surrogateescape")) > WireLimits.MAX_COMMAND_BYTES:
                raise ValueError(f"command longer than {WireLimits.MAX_COMMAND_BYTES} bytes (UTF-8)")
            if "\x00" in cmd:
                raise ValueError("commands must not contain NUL bytes")
        return commands

    @field_validator("env", "solution_env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        total = 0
        for name, value in env.items():
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(f"env name {name[:64]!r} is not a variable name ([A-Za-z_][A-Za-z0-9_]*)")
            if name in SANDBOX_OWN_ENV:
                raise ValueError(f"env may not set {name}: it is the sandbox's own")
            if "\x00" in value:
                raise ValueError(f"env {name} contains a NUL byte")
            total += len(name) + len(value.encode("utf-8", "surrogateescape"))
        if total > WireLimits.MAX_ENV_BYTES:
            raise ValueError(f"env totals more than {WireLimits.MAX_ENV_BYTES} bytes")
        return env

    @field_validator("instruction")
    @classmethod
    def _instruction_not_blank(cls, instruction: str) -> str:
        if not instruction.strip():
            raise ValueError("instruction must not be blank")
        return instruction

    @model_validator(mode="after")
    def _files_total_bounded(self) -> Task:
        trees = [self.files, self.verify_files, self.outside_files, self.solution_files]
        for step in self.steps:
            trees += [step.files, step.verify_files, step.solution_files]
        total = sum(len(text.encode("utf-8", "surrogatepass")) for tree in trees for text in tree.values())
        if total > WireLimits.MAX_FILES_BYTES:
            raise ValueError(f"the task's files (all kinds, all steps) total more than {WireLimits.MAX_FILES_BYTES} bytes")
        return self

    @model_validator(mode="after")
    def _workdir_clear_of_outside_files(self) -> Task:
        if self.workdir is not None:
            for path in self.outside_files:
                if path == self.workdir or path.startswith(self.workdir + "/"):
                    raise ValueError(f"outside_files {path!r} is inside the workdir: give it in `files`")
        return self

    def for_step(self, step: TaskStep) -> Any:
        """This task as `step` runs it: its instruction, files, setup, hidden tests, verify, solution and agent
        deadline; nothing else changes (the sandbox, users, reward rules) and it has no steps of its own. Of the
        same class as `self` (a `RolloutRequest` stays one)."""
        return self.model_copy(update={
            "instruction": step.instruction, "files": step.files, "setup": step.setup,
            "verify_files": step.verify_files, "verify": step.verify, "solution": step.solution,
            "solution_files": step.solution_files, "steps": [],
            "agent_timeout_s": step.agent_timeout_s or self.agent_timeout_s,
        })

    def writable_roots(self) -> tuple[str, ...]:
        """The task's own directories the agent can write, besides the sandbox's (`AGENT_WRITABLE_ROOTS`): its
        workdir and the top-level directories of its `outside_files`."""
        tops = {"/" + path.lstrip("/").split("/", 1)[0] for path in self.outside_files}
        return tuple(sorted({*([self.workdir] if self.workdir else []), *tops}))

    @model_validator(mode="after")
    def _env_outside_the_workspace(self) -> Task:
        """Hardened verify runs with the task's `env`: a search path into what the agent can write would hand
        verify to the agent (a planted `python3` on PATH, a library in LD_PRELOAD)."""
        if not self.verify_hardening:
            return self
        roots = (*AGENT_WRITABLE_ROOTS, *self.writable_roots())
        for name, value in self.env.items():
            problem = workspace_entry(name, value, roots)
            if problem is not None:
                raise ValueError(
                    f"env {problem}: verify would load what the agent left there. Point it outside "
                    f"{', '.join(AGENT_WRITABLE_ROOTS)}, or set verify_hardening: false"
                )
        return self


class TaskStep(WireModel):
    """One step of a multi-step task (Harbor's `[[steps]]`): run in the task's sandbox after the steps before it.
    Its `files` are laid into the workdir before its `setup`; its hidden tests, `verify` and reward rule are the
    task's (`verify_files_root`, `reward_file_required`, hardening) with its own files and commands."""

    name: str = Field(min_length=1, max_length=WireLimits.MAX_NAME_CHARS, description="The step's name.")
    instruction: str = Field(min_length=1, max_length=WireLimits.MAX_INSTRUCTION_CHARS)
    files: dict[str, str] = Field(default_factory=dict, description="Laid into the workdir before the step.")
    setup: list[str] = _commands("Run before the step's agent, as setup is.")
    verify_files: dict[str, str] = Field(default_factory=dict, description="The step's hidden tests.")
    verify: list[str] = _commands("The step's verify commands.")
    solution: list[str] = _commands("The step's reference solution, for the 'oracle' agent.")
    solution_files: dict[str, str] = Field(default_factory=dict, description="Laid at `/solution` for the oracle.")
    min_reward: float | dict[str, float] | None = Field(
        default=None,
        description="A gate: a number gates the step's `reward`, a mapping each named metric of its `rewards` (a "
        "missing one fails); a step below it ends the task (Harbor's `min_reward`).",
    )
    agent_timeout_s: float | None = Field(default=None, gt=0, le=WireLimits.MAX_AGENT_TIMEOUT_S)

    _files_confined = field_validator("files", "verify_files", "solution_files")(Task._files_confined.__func__)
    _commands_bounded = field_validator("setup", "verify", "solution")(Task._commands_bounded.__func__)


Task.model_rebuild()
