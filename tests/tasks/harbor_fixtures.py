"""Harbor task directories made on the fly, for tests."""

from __future__ import annotations

from pathlib import Path

REWARD = "/logs/verifier/reward.txt"


def make_task(
    root: Path,
    name: str,
    *,
    toml: str = '[agent]\ntimeout_sec = 60\n[verifier]\ntimeout_sec = 30\n',
    instruction: str | None = "Create done.txt containing ok.",
    dockerfile: str = "FROM scratch\nWORKDIR /workspace\n",
    env_files: dict[str, str] | None = None,
    solve: str = "echo ok > done.txt",
    test_sh: str = f'mkdir -p /logs/verifier; [ "$(cat done.txt)" = ok ] && echo 1 > {REWARD} || echo 0 > {REWARD}',
    extra_tests: dict[str, str] | None = None,
) -> Path:
    task = root / name
    for sub in ("environment", "solution", "tests"):
        (task / sub).mkdir(parents=True, exist_ok=True)
    (task / "task.toml").write_text(toml)
    if instruction is not None:
        (task / "instruction.md").write_text(instruction)
    (task / "environment" / "Dockerfile").write_text(dockerfile)
    for path, text in (env_files or {}).items():
        (task / "environment" / path).parent.mkdir(parents=True, exist_ok=True)
        (task / "environment" / path).write_text(text)
    (task / "solution" / "solve.sh").write_text(f"#!/bin/bash\n{solve}\n")
    (task / "tests" / "test.sh").write_text(f"#!/bin/bash\n{test_sh}\n")
    for path, text in (extra_tests or {}).items():
        (task / "tests" / path).write_text(text)
    return task
