"""The Landlock tier's confinement, run for real (this kernel: Landlock ABI 7), and the refusal where no tier
works.

Each confined command runs through `confine` exactly as the local backend starts it. As root, the command is
confined as a uid of its own that also owns a canary process (the Space case: the server and its sandboxes
share one uid, so nothing but Landlock and seccomp stands between them); what it must reach still works.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from coding_agent_env.sandbox.landlock import Policy, confine_argv, landlock_refusal, system_paths
from coding_agent_env.sandbox.landlock.confine import CONFINE_FAILED
from coding_agent_env.sandbox.local.refusal import no_tier_refusal

UID = 61_234 if os.geteuid() == 0 else None
"""The uid the canary and the confined commands share (as root); otherwise this user's own."""
CANARY = "operator-secret-7c0ffee"
_IOPRIO_SET = {"x86_64": 251, "aarch64": 30}[platform.machine()]


@pytest.fixture
def root() -> Iterator[Path]:
    """Not pytest's tmp_path (0700 root's above it): the confined uid must traverse to its own directory."""
    tmp_path = Path(tempfile.mkdtemp(prefix="cae-landlock-"))
    try:
        yield _populated(tmp_path)
    finally:
        shutil.rmtree(tmp_path)


def _populated(tmp_path: Path) -> Path:
    for sub in ("work", "other", "state"):
        (tmp_path / sub).mkdir()
    (tmp_path / "other" / "secret.txt").write_text(CANARY)
    (tmp_path / "state" / "token").write_text(CANARY)
    os.chmod(tmp_path, 0o755)
    if UID is not None:
        for path in (tmp_path / "work", tmp_path / "other", tmp_path / "other" / "secret.txt"):
            os.chown(path, UID, UID)
    return tmp_path


@pytest.fixture
def canary() -> Iterator[int]:
    """A process of the same uid with a secret in its environment (the server, as a Space runs it)."""
    creds = {"user": UID, "group": UID, "extra_groups": []} if UID is not None else {}
    proc = subprocess.Popen(  # type: ignore[call-overload]
        ["sleep", "300"], env={"OPENAI_API_KEY": CANARY}, start_new_session=True, **creds)
    try:
        yield proc.pid
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def confined(root: Path, script: str, **policy: object) -> subprocess.CompletedProcess[str]:
    fields = {"read": system_paths(), "write": (str(root / "work"),), "uid": UID, **policy}
    argv = confine_argv(Policy(**fields), ["/bin/sh", "-c", script])  # type: ignore[arg-type]
    return subprocess.run(argv, cwd=root / "work", env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                          timeout=30, check=False)


def test_landlock_is_usable_here() -> None:
    assert landlock_refusal(UID) is None


def test_its_own_directory_and_the_system_work(root: Path) -> None:
    done = confined(root, "echo made > f && cat f && ls /usr/bin | grep -qx sh && python3 -c 'print(2 + 2)'")
    assert done.returncode == 0 and done.stdout == "made\n4\n", done.stderr


def test_other_processes_secrets_are_out_of_reach(root: Path, canary: int) -> None:
    script = (f"cat /proc/{canary}/environ /proc/{canary}/cmdline /proc/1/environ; head -c 64 /proc/{canary}/mem; "
              f"ls /proc; kill -0 {canary} && echo SIGNALLED")
    done = confined(root, script)
    assert CANARY not in done.stdout and "sleep" not in done.stdout and "SIGNALLED" not in done.stdout, done.stdout
    assert done.stderr.count("Permission denied") >= 4 and "Operation not permitted" in done.stderr, done.stderr


def test_files_outside_its_own_are_out_of_reach(root: Path) -> None:
    script = (f"cat {root}/other/secret.txt {root}/state/token; ls {root}; echo x > {root}/other/new; "
              f"echo x > /tmp/cae-landlock-escape; cat /proc/self/../1/environ")
    done = confined(root, script)
    assert CANARY not in done.stdout and not (root / "other" / "new").exists(), done.stdout
    assert not Path("/tmp/cae-landlock-escape").exists()
    assert done.stderr.count("Permission denied") >= 5, done.stderr


def test_network_is_the_relay_port_alone() -> None:
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    relay, other = (listener.getsockname()[1] for listener in listeners)
    probe = ("import socket\n"
             "def tcp(port):\n"
             "    try:\n        return socket.create_connection(('127.0.0.1', port), 5) and 'connected'\n"
             "    except OSError as exc:\n        return exc.strerror\n"
             "def udp():\n"
             "    try:\n        return socket.socket(socket.AF_INET, socket.SOCK_DGRAM) and 'udp'\n"
             "    except OSError as exc:\n        return exc.strerror\n"
             f"print(tcp({relay}), tcp({other}), udp(), sep='|')")
    try:
        with_relay = _python(probe, inet=True, connect_ports=(relay,))
        without = _python(probe)
    finally:
        for listener in listeners:
            listener.close()
    assert with_relay == "connected|Permission denied|Operation not permitted", with_relay
    assert without == "Operation not permitted|Operation not permitted|Operation not permitted", without


def _python(code: str, **policy: object) -> str:
    # As root the command runs as UID, which cannot read the test's own interpreter (under /root here).
    python = sys.executable if UID is None else "/usr/bin/python3"
    argv = confine_argv(Policy(read=system_paths(), write=(), uid=UID, **policy), [python, "-c", code])  # type: ignore[arg-type]
    done = subprocess.run(argv, cwd="/", env={}, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_namespaces_ptrace_and_leaving_the_group_are_refused(root: Path) -> None:
    code = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nout = []\n"
            "def raw(result):\n    if result != 0:\n        raise OSError(ctypes.get_errno(), 'refused')\n"
            "for name, call in (('unshare', lambda: raw(libc.unshare(0x10000000 | 0x40000000))),"
            " ('setsid', os.setsid), ('ptrace', lambda: raw(libc.ptrace(16, 1, 0, 0)))):\n"
            "    try:\n        call(); out.append(name + ' ALLOWED')\n"
            "    except OSError as exc:\n        out.append(name + ' ' + str(exc.errno))\n"
            "print(' '.join(out))")
    assert _python(code) == "unshare 1 setsid 1 ptrace 1"


def test_a_policy_it_cannot_apply_never_runs_the_command(root: Path) -> None:
    argv = confine_argv(Policy(read=(), write=(), rlimits={"nonsense": 1}), ["/bin/echo", "RAN"])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == CONFINE_FAILED and "RAN" not in done.stdout


def test_the_refusal_names_each_cause_and_what_really_helps() -> None:
    causes = "Bubblewrap cannot make its namespaces here (no permission). Landlock is absent here."
    inside = no_tier_refusal(causes, container=True)
    assert causes in inside
    assert "seccomp=unconfined" in inside and "systempaths=unconfined" in inside
    assert "sysctl" not in inside and "apt-get" not in inside  # host settings cannot help inside a container
    host = no_tier_refusal(causes, container=False)
    assert "unprivileged_userns_clone" in host and "systempaths" not in host
    for text in (inside, host):
        sentences = re.split(r"(?<=[.)])\s+(?=[A-Z])", text)
        assert "unisolated" in sentences[-1] and not any("run unisolated)" in s for s in sentences), text


def test_the_server_s_limits_and_priorities_are_out_of_reach(canary: int) -> None:
    """A process of the same uid (the server, on a Space) keeps its rlimits, nice value, scheduling policy and I/O
    priority (Landlock's scopes cover signals and ptrace, not these); the command's own still change."""
    before = _standing(canary)
    code = ("import ctypes, os, resource\nlibc = ctypes.CDLL(None, use_errno=True)\nout = []\n"
            f"victim = {canary}\n"
            "def raw(result):\n    if result != 0:\n        raise OSError(ctypes.get_errno(), 'refused')\n"
            "calls = (('prlimit', lambda: resource.prlimit(victim, resource.RLIMIT_NOFILE, (5, 5))),"
            " ('cpu', lambda: resource.prlimit(victim, resource.RLIMIT_CPU, (1, 1))),"
            " ('nice', lambda: os.setpriority(os.PRIO_PROCESS, victim, 19)),"
            f" ('ionice', lambda: raw(libc.syscall({_IOPRIO_SET}, 1, victim, 3 << 13))),"
            " ('idle', lambda: os.sched_setscheduler(victim, os.SCHED_IDLE, os.sched_param(0))),"
            " ('read', lambda: resource.prlimit(victim, resource.RLIMIT_NOFILE)),"
            " ('own', lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))),"
            " ('ownnice', lambda: os.setpriority(os.PRIO_PROCESS, 0, 5)),"
            f" ('ownio', lambda: raw(libc.syscall({_IOPRIO_SET}, 1, 0, 3 << 13))),"
            " ('ownidle', lambda: os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))),"
            " ('bypid', lambda: (resource.prlimit(os.getpid(), resource.RLIMIT_NOFILE, (32, 32)),"
            " os.setpriority(os.PRIO_PROCESS, os.getpid(), 6))))\n"
            "for name, call in calls:\n"
            "    try:\n        call(); out.append(name + ' ok')\n"
            "    except OSError as exc:\n        out.append(name + ' ' + str(exc.errno))\n"
            "print(' '.join(out))")
    said = _python(code)
    after = _standing(canary)
    assert after == before, said
    assert said == ("prlimit 1 cpu 1 nice 1 ionice 1 idle 1 read ok own ok ownnice ok ownio ok ownidle ok bypid ok"), said


def _standing(pid: int) -> tuple[str, int, int, str]:
    """A process's limits, nice value, scheduling policy and I/O priority, as another process of its uid sees them
    (/proc: prlimit would need CAP_SYS_RESOURCE where the test runs as root and the canary as UID)."""
    ioprio = subprocess.run(["ionice", "-p", str(pid)], capture_output=True, text=True, timeout=10, check=False)
    return (Path(f"/proc/{pid}/limits").read_text(), os.getpriority(os.PRIO_PROCESS, pid),
            os.sched_getscheduler(pid), ioprio.stdout)
