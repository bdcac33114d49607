"""Whether this host can confine commands with Landlock and seccomp (`landlock_refusal`), and the argv that
starts a command confined (`confine_argv`)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from coding_agent_env.sandbox.landlock import ruleset, syscall_filter
from coding_agent_env.sandbox.landlock.policy import Policy, system_paths

__all__ = ["CONFINE", "confine_argv", "landlock_refusal"]

CONFINE = str(Path(__file__).with_name("confine.py"))
_TRIAL_TIMEOUT_S = 10.0


def confine_argv(policy: Policy, argv: Sequence[str]) -> list[str]:
    """Start `argv` confined by `policy`: the server's interpreter runs `confine` by path, isolated (`-I -S`: no
    site-packages, no environment variables of Python's, nothing of the working directory)."""
    return [sys.executable, "-I", "-S", CONFINE, *policy.args(), "--", *argv]


def landlock_refusal(uid: int | None) -> str | None:
    """None when a command confined here really runs (tried: as `uid` when given, i.e. the server is root) and
    is really denied what its policy leaves out; else why not, in one sentence. Blocking (one short run)."""
    version = ruleset.abi()
    if version < ruleset.MIN_ABI:
        where = "absent, disabled or filtered out by seccomp" if version == 0 else f"ABI {version}"
        return f"Landlock is {where} here; this tier needs ABI {ruleset.MIN_ABI} or later (Linux 6.12)"
    unknown = syscall_filter.supported()
    if unknown is not None:
        return unknown
    with tempfile.TemporaryDirectory(prefix="landlock-probe-") as trial:
        policy = Policy(read=system_paths(), write=(), uid=uid)
        # Must succeed: a system binary runs; must fail: the working directory is outside the policy.
        argv = confine_argv(policy, ["/bin/sh", "-c", f"/bin/true && ! ls {trial} 2>/dev/null"])
        try:
            done = subprocess.run(argv, capture_output=True, timeout=_TRIAL_TIMEOUT_S, env={}, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"a confined trial command did not run ({exc})"
    if done.returncode != 0:
        said = (done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no message"])[0]
        return f"a confined trial command failed (exit {done.returncode}: {said[:200]})"
    return None
